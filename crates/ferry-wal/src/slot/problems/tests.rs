//! The problem list from facts alone: a healthy setup reports only the capacity note; each
//! other finding comes from the one fact that causes it, in the words users see.

use super::*;
use crate::slot::check::{PublicationFacts, TableFacts};
use crate::slot::failover::{standby_slot_names, FailoverFacts, StandbySlot};
use crate::slot::{
    AcceptedTypes, Capacity, RequiredColumn, RoleGrants, SlotSpec, SlotState, TableGrants,
    TableSpec,
};

const JSONB: u32 = 3802;
const TEXT: u32 = 25;

fn outbox() -> TableSpec {
    TableSpec {
        required_columns: vec![
            RequiredColumn {
                name: "aggregateid".into(),
                config_key: "outbox.aggregate_id_column (route.key_format = \"json\")".into(),
                accepted_types: None,
            },
            RequiredColumn {
                name: "payload".into(),
                config_key: "outbox.payload_column".into(),
                accepted_types: Some(AcceptedTypes {
                    oids: vec![JSONB, TEXT],
                    fix: "use a column of a type Ferry reads there (jsonb, text), or set outbox.payload_column to another column".into(),
                }),
            },
        ],
        ..TableSpec::new("public", "outbox")
    }
}

fn spec() -> SlotSpec {
    SlotSpec {
        slot: "ferry".into(),
        publication: "ferry_outbox".into(),
        tables: vec![outbox()],
        create_slot: false,
        create_publication: false,
        failover: false,
    }
}

fn column(name: &str, type_oid: u32, type_name: &str) -> TableColumn {
    TableColumn {
        name: name.into(),
        type_oid,
        type_name: type_name.into(),
    }
}

fn outbox_facts() -> TableFacts {
    TableFacts {
        relkind: Some(b'r'),
        columns: vec![
            column("id", 2950, "uuid"),
            column("aggregateid", TEXT, "text"),
            column("payload", JSONB, "jsonb"),
        ],
    }
}

fn table_grants() -> TableGrants {
    TableGrants {
        schema_usage: true,
        owner: Some(("ferry".into(), true)),
    }
}

/// A slot Ferry has streamed before, nobody streams now.
fn slot_state() -> SlotState {
    SlotState {
        confirmed_flush_lsn: "0/16B3748".parse().unwrap(),
        restart_lsn: "0/16B3710".parse().unwrap(),
        active_pid: None,
        wal_status: Some("reserved".into()),
        plugin: Some("pgoutput".into()),
        database: Some("shop".into()),
        slot_type: "logical".into(),
        failover: Some(false),
        synced: Some(false),
    }
}

/// Everything in place: the publication, the slot, the privileges, room to spare.
fn healthy() -> Facts {
    Facts {
        wal_level: "logical".into(),
        role: "ferry".into(),
        can_replicate: true,
        tables: vec![outbox_facts()],
        grants: RoleGrants {
            role: "ferry".into(),
            database: "shop".into(),
            create_on_database: true,
            tables: vec![table_grants()],
        },
        publication: Some(PublicationFacts {
            all_tables: false,
            insert: true,
            via_root: true,
            covers: vec![Some(true)],
            unrelayed: vec![],
        }),
        database: "shop".into(),
        capacity: Capacity {
            max_slots: 10,
            slots_used: 3,
            max_senders: 10,
            senders_used: 2,
        },
        slot: Some(slot_state()),
        failover: None,
    }
}

/// The list without the capacity note every check ends its problems with.
fn findings(spec: &SlotSpec, facts: &Facts) -> Vec<Problem> {
    let list = problems(spec, facts);
    let counts = list
        .iter()
        .filter(|p| p.what.starts_with("replication slots: "))
        .count();
    assert_eq!(counts, 1, "one capacity note: {list:#?}");
    list.into_iter()
        .filter(|p| !p.what.starts_with("replication slots: "))
        .collect()
}

/// The one finding `facts` show, besides the capacity note.
fn the_one(spec: &SlotSpec, facts: &Facts) -> Problem {
    let found = findings(spec, facts);
    assert_eq!(found.len(), 1, "{found:#?}");
    found.into_iter().next().unwrap()
}

#[track_caller]
fn assert_error(p: &Problem, what: &str, fix_parts: &[&str]) {
    assert_problem(p, Severity::Error, what, fix_parts);
}

#[track_caller]
fn assert_problem(p: &Problem, severity: Severity, what: &str, fix_parts: &[&str]) {
    assert_eq!(p.severity, severity, "{p:#?}");
    assert_eq!(p.what, what);
    for part in fix_parts {
        assert!(p.fix.contains(part), "fix lacks {part:?}: {:?}", p.fix);
    }
}

// --- a healthy setup, and the list's order ---

#[test]
fn a_healthy_setup_reports_only_the_capacity_note() {
    assert_eq!(
        problems(&spec(), &healthy()),
        vec![Problem {
            severity: Severity::Note,
            what: "replication slots: 3 of 10 in use; WAL senders: 2 of 10 in use".into(),
            fix: "none needed".into(),
        }]
    );
}

#[test]
fn a_first_start_notes_what_ferry_creates() {
    let spec = SlotSpec {
        create_slot: true,
        create_publication: true,
        ..spec()
    };
    let facts = Facts {
        publication: None,
        slot: None,
        ..healthy()
    };
    let list = problems(&spec, &facts);
    assert!(
        list.iter().all(|p| p.severity == Severity::Note),
        "{list:#?}"
    );
    let whats: Vec<&str> = list.iter().map(|p| p.what.as_str()).collect();
    assert_eq!(
        whats,
        [
            "publication \"ferry_outbox\" does not exist",
            "replication slots: 3 of 10 in use; WAL senders: 2 of 10 in use",
            "replication slot \"ferry\" does not exist",
        ]
    );
    assert_eq!(
        list[0].fix,
        "none needed: Ferry creates it (`CREATE PUBLICATION \"ferry_outbox\" FOR TABLE \"public\".\"outbox\" \
         WITH (publish = 'insert', publish_via_partition_root = true)`)"
    );
    assert_eq!(
        list[2].fix,
        "none needed: Ferry creates it at the server's current position"
    );
}

#[test]
fn errors_and_warnings_come_in_the_order_found_then_the_notes() {
    let mut facts = healthy();
    facts.wal_level = "replica".into();
    facts.tables[0].columns.retain(|c| c.name != "payload");
    facts.publication.as_mut().unwrap().all_tables = true;
    facts.publication.as_mut().unwrap().covers = vec![None];
    facts.slot.as_mut().unwrap().active_pid = Some(77);
    let list = problems(&spec(), &facts);
    let order: Vec<(Severity, &str)> = list
        .iter()
        .map(|p| (p.severity, p.what.split(' ').next().unwrap()))
        .collect();
    assert_eq!(
        order,
        [
            (Severity::Error, "wal_level"),
            (Severity::Error, "table"),
            (Severity::Warning, "replication"),
            (Severity::Note, "publication"),
            (Severity::Note, "replication"),
        ],
        "{list:#?}"
    );
    assert!(list[2].what.contains("is being streamed by process 77"));
    assert!(list[3].what.contains("is FOR ALL TABLES"));
    assert!(list[4].what.starts_with("replication slots: "));
}

#[test]
fn a_problem_shows_what_then_its_fix() {
    let p = Problem {
        severity: Severity::Error,
        what: "it is broken".into(),
        fix: "mend it".into(),
    };
    assert_eq!(p.to_string(), "it is broken; fix: mend it");
}

// --- the server and the role ---

#[test]
fn wal_level_other_than_logical_is_an_error_with_every_platforms_setting() {
    let facts = Facts {
        wal_level: "replica".into(),
        ..healthy()
    };
    assert_error(
        &the_one(&spec(), &facts),
        "wal_level is \"replica\", and logical decoding needs \"logical\"",
        &[
            "run ALTER SYSTEM SET wal_level = logical and restart PostgreSQL",
            "rds.logical_replication = 1",
            "cloudsql.logical_decoding = on",
            "azure.replication_support = logical",
        ],
    );
}

#[test]
fn a_role_without_replication_is_an_error_with_the_alter_role() {
    let facts = Facts {
        role: "Ferry svc".into(),
        can_replicate: false,
        ..healthy()
    };
    assert_error(
        &the_one(&spec(), &facts),
        "role \"Ferry svc\" lacks the REPLICATION attribute",
        &["run ALTER ROLE \"Ferry svc\" WITH REPLICATION as a superuser (on Amazon RDS: GRANT rds_replication TO \"Ferry svc\")"],
    );
}

// --- the outbox tables ---

#[test]
fn a_missing_table_is_an_error_naming_its_key_and_its_columns_are_not_checked() {
    let mut facts = healthy();
    facts.tables[0] = TableFacts {
        relkind: None,
        columns: vec![],
    };
    facts.grants.tables[0].owner = None;
    facts.publication.as_mut().unwrap().covers = vec![None];
    assert_error(
        &the_one(&spec(), &facts),
        "table \"public\".\"outbox\" does not exist (or is not a table)",
        &["create it (sql/outbox.sql has the Debezium-compatible DDL) or point outbox.table at your outbox"],
    );
}

#[test]
fn a_missing_column_names_the_nearest_by_its_key_alone() {
    let mut facts = healthy();
    facts.tables[0].columns[1].name = "aggregate_id".into();
    assert_error(
        &the_one(&spec(), &facts),
        "table \"public\".\"outbox\" has no column \"aggregateid\" \
         (named by outbox.aggregate_id_column (route.key_format = \"json\"))",
        &["set outbox.aggregate_id_column = \"aggregate_id\" (the nearest of its columns: id, aggregate_id, payload) or add the column"],
    );
}

#[test]
fn a_missing_column_with_none_near_lists_every_column() {
    let mut facts = healthy();
    facts.tables[0].columns[2].name = "body".into();
    assert_error(
        &the_one(&spec(), &facts),
        "table \"public\".\"outbox\" has no column \"payload\" (named by outbox.payload_column)",
        &["set outbox.payload_column to one of its columns (id, aggregateid, body) or add the column"],
    );
}

#[test]
fn a_column_of_a_type_the_caller_cannot_read_is_an_error_with_the_callers_fix() {
    let mut facts = healthy();
    facts.tables[0].columns[2] = column("payload", 23, "integer");
    assert_error(
        &the_one(&spec(), &facts),
        "column \"public\".\"outbox\".payload (outbox.payload_column) is of type integer, which Ferry cannot use there",
        &["use a column of a type Ferry reads there (jsonb, text), or set outbox.payload_column to another column"],
    );
}

#[test]
fn a_column_without_accepted_types_may_have_any_type() {
    let mut facts = healthy();
    facts.tables[0].columns[1] = column("aggregateid", 23, "integer");
    assert_eq!(findings(&spec(), &facts), vec![]);
}

#[test]
fn each_table_is_checked_and_reported_in_the_configurations_order() {
    let spec = SlotSpec {
        tables: vec![
            outbox(),
            TableSpec {
                config_key: "tables[1].outbox.table".into(),
                ..TableSpec::new("billing", "events")
            },
            TableSpec::new("public", "ok"),
        ],
        ..spec()
    };
    let mut facts = healthy();
    facts.tables = vec![
        TableFacts {
            relkind: Some(b'r'),
            columns: vec![
                column("id", 2950, "uuid"),
                column("aggregateid", TEXT, "text"),
            ],
        },
        TableFacts {
            relkind: None,
            columns: vec![],
        },
        TableFacts {
            relkind: Some(b'r'),
            columns: vec![],
        },
    ];
    facts.grants.tables = vec![table_grants(), table_grants(), table_grants()];
    facts.publication.as_mut().unwrap().covers = vec![Some(true), None, Some(false)];
    let found = findings(&spec, &facts);
    let whats: Vec<&str> = found.iter().map(|p| p.what.as_str()).collect();
    assert_eq!(
        whats,
        [
            "table \"public\".\"outbox\" has no column \"payload\" (named by outbox.payload_column)",
            "table \"billing\".\"events\" does not exist (or is not a table)",
            "publication \"ferry_outbox\" does not include table \"public\".\"ok\"",
        ]
    );
    assert!(found[1]
        .fix
        .contains("point tables[1].outbox.table at your outbox"));
}

// --- privileges ---

#[test]
fn a_schema_without_usage_is_an_error_and_its_coverage_is_not_judged() {
    let mut facts = healthy();
    facts.grants.tables[0].schema_usage = false;
    facts.publication.as_mut().unwrap().covers = vec![None];
    assert_error(
        &the_one(&spec(), &facts),
        "role \"ferry\" lacks USAGE on schema \"public\", so it cannot look up table \"public\".\"outbox\"",
        &["run GRANT USAGE ON SCHEMA \"public\" TO \"ferry\""],
    );
}

// --- the publication ---

#[test]
fn a_missing_publication_ferry_may_not_create_is_an_error_with_the_create() {
    let facts = Facts {
        publication: None,
        ..healthy()
    };
    assert_error(
        &the_one(&spec(), &facts),
        "publication \"ferry_outbox\" does not exist",
        &[
            "run `CREATE PUBLICATION \"ferry_outbox\" FOR TABLE \"public\".\"outbox\" \
             WITH (publish = 'insert', publish_via_partition_root = true)` as the table's owner, \
             or set postgres.create_publication = true",
        ],
    );
}

#[test]
fn a_missing_publication_ferry_may_create_is_a_note() {
    let spec = SlotSpec {
        create_publication: true,
        ..spec()
    };
    let facts = Facts {
        publication: None,
        ..healthy()
    };
    assert_problem(
        &the_one(&spec, &facts),
        Severity::Note,
        "publication \"ferry_outbox\" does not exist",
        &["none needed: Ferry creates it (`CREATE PUBLICATION \"ferry_outbox\" FOR TABLE"],
    );
}

#[test]
fn a_missing_publication_ferry_may_create_but_cannot_is_an_error_and_no_note() {
    let spec = SlotSpec {
        create_publication: true,
        ..spec()
    };
    let mut facts = Facts {
        publication: None,
        ..healthy()
    };
    facts.grants.create_on_database = false;
    facts.grants.tables[0].owner = Some(("app".into(), false));
    let found = findings(&spec, &facts);
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(found.iter().all(|p| p.severity == Severity::Error));
    assert!(found[0]
        .what
        .starts_with("role \"ferry\" lacks CREATE on database \"shop\""));
    assert!(found[1].what.starts_with(
        "role \"ferry\" does not own table \"public\".\"outbox\" (its owner is \"app\")"
    ));
}

#[test]
fn a_publication_without_inserts_is_an_error() {
    let mut facts = healthy();
    facts.publication.as_mut().unwrap().insert = false;
    assert_error(
        &the_one(&spec(), &facts),
        "publication \"ferry_outbox\" does not publish INSERTs",
        &["run ALTER PUBLICATION \"ferry_outbox\" SET (publish = 'insert')"],
    );
}

#[test]
fn a_publication_without_the_table_is_an_error_with_the_add_table() {
    let mut facts = healthy();
    facts.publication.as_mut().unwrap().covers = vec![Some(false)];
    assert_error(
        &the_one(&spec(), &facts),
        "publication \"ferry_outbox\" does not include table \"public\".\"outbox\"",
        &[
            "stop every Ferry running a configuration without this table (it would skip the table's rows)",
            "then run ALTER PUBLICATION \"ferry_outbox\" ADD TABLE \"public\".\"outbox\" (Ferry never alters an existing publication)",
        ],
    );
}

#[test]
fn a_partitioned_table_published_per_partition_is_an_error() {
    let mut facts = healthy();
    facts.tables[0].relkind = Some(b'p');
    facts.publication.as_mut().unwrap().via_root = false;
    assert_error(
        &the_one(&spec(), &facts),
        "table \"public\".\"outbox\" is partitioned but publication \"ferry_outbox\" publishes per partition",
        &["run ALTER PUBLICATION \"ferry_outbox\" SET (publish_via_partition_root = true)"],
    );
}

#[test]
fn a_plain_table_needs_no_publish_via_partition_root() {
    let mut facts = healthy();
    facts.publication.as_mut().unwrap().via_root = false;
    assert_eq!(findings(&spec(), &facts), vec![]);
}

#[test]
fn a_table_the_publication_lists_that_no_entry_relays_is_an_error() {
    let mut facts = healthy();
    facts.publication.as_mut().unwrap().unrelayed = vec!["\"public\".\"audit\"".into()];
    let p = the_one(&spec(), &facts);
    assert_eq!(p, unrelayed_table("ferry_outbox", "\"public\".\"audit\""));
    assert_eq!(p.severity, Severity::Error);
    assert!(p.what.starts_with(
        "publication \"ferry_outbox\" includes table \"public\".\"audit\", which no [outbox] or [[tables]] entry relays"
    ));
    assert!(p.what.ends_with("so they would never reach Kafka"));
    assert!(p
        .fix
        .starts_with("relay it: add a [[tables]] entry with outbox.table = \"public.audit\""));
    assert!(p
        .fix
        .contains("ALTER PUBLICATION \"ferry_outbox\" DROP TABLE \"public\".\"audit\""));
}

#[test]
fn a_publication_for_all_tables_is_a_note() {
    let mut facts = healthy();
    let publication = facts.publication.as_mut().unwrap();
    publication.all_tables = true;
    publication.covers = vec![None];
    assert_problem(
        &the_one(&spec(), &facts),
        Severity::Note,
        "publication \"ferry_outbox\" is FOR ALL TABLES: PostgreSQL decodes every table's inserts for Ferry, \
         which relays the outbox tables' and skips the rest",
        &["none needed; a publication of the outbox tables only saves that work: `CREATE PUBLICATION \"ferry_outbox\""],
    );
}

// --- capacity ---

#[test]
fn no_free_slot_for_a_missing_slot_is_an_error() {
    let spec = SlotSpec {
        create_slot: true,
        ..spec()
    };
    let mut facts = healthy();
    facts.slot = None;
    facts.capacity.slots_used = 10;
    let found = findings(&spec, &facts);
    assert_eq!(found.len(), 2, "{found:#?}");
    assert_error(
        &found[0],
        "all 10 replication slots are in use, so slot \"ferry\" cannot be created",
        &[
            "drop a slot nothing uses (SELECT slot_name, active FROM pg_replication_slots; SELECT pg_drop_replication_slot('name'))",
            "or raise max_replication_slots and restart PostgreSQL",
        ],
    );
    assert_eq!(found[1].what, "replication slot \"ferry\" does not exist");
    assert_eq!(found[1].severity, Severity::Note);
}

#[test]
fn no_free_slot_is_no_problem_for_an_existing_slot() {
    let mut facts = healthy();
    facts.capacity.slots_used = 10;
    assert_eq!(findings(&spec(), &facts), vec![]);
}

#[test]
fn no_free_wal_sender_is_an_error() {
    let mut facts = healthy();
    facts.capacity.senders_used = 10;
    assert_error(
        &the_one(&spec(), &facts),
        "all 10 WAL senders are in use (max_wal_senders), so Ferry cannot open its replication connection",
        &[
            "stop a replication consumer you no longer need (see pg_stat_replication)",
            "or raise max_wal_senders and restart PostgreSQL",
        ],
    );
}

#[test]
fn no_free_wal_sender_while_another_process_streams_the_slot_is_only_that_warning() {
    let mut facts = healthy();
    facts.capacity.senders_used = 10;
    facts.slot.as_mut().unwrap().active_pid = Some(77);
    let p = the_one(&spec(), &facts);
    assert_eq!(p.severity, Severity::Warning);
    assert_eq!(
        p.what,
        "replication slot \"ferry\" is being streamed by process 77"
    );
}

#[test]
fn the_capacity_note_counts_slots_and_senders() {
    let mut facts = healthy();
    facts.capacity = Capacity {
        max_slots: 4,
        slots_used: 1,
        max_senders: 8,
        senders_used: 0,
    };
    let list = problems(&spec(), &facts);
    assert_problem(
        list.last().unwrap(),
        Severity::Note,
        "replication slots: 1 of 4 in use; WAL senders: 0 of 8 in use",
        &["none needed"],
    );
}

// --- the slot ---

#[test]
fn a_missing_slot_ferry_may_not_create_is_an_error_with_the_create() {
    let facts = Facts {
        slot: None,
        ..healthy()
    };
    assert_error(
        &the_one(&spec(), &facts),
        "replication slot \"ferry\" does not exist",
        &["set postgres.create_slot = true, or run SELECT pg_create_logical_replication_slot('ferry', 'pgoutput')"],
    );
}

#[test]
fn a_missing_slot_ferry_may_create_is_a_note() {
    let spec = SlotSpec {
        create_slot: true,
        ..spec()
    };
    let facts = Facts {
        slot: None,
        ..healthy()
    };
    assert_problem(
        &the_one(&spec, &facts),
        Severity::Note,
        "replication slot \"ferry\" does not exist",
        &["none needed: Ferry creates it at the server's current position"],
    );
}

#[test]
fn a_slot_still_being_created_is_a_warning_and_not_yet_checked() {
    let mut facts = healthy();
    let slot = facts.slot.as_mut().unwrap();
    slot.active_pid = Some(4242);
    slot.confirmed_flush_lsn = Lsn::ZERO;
    slot.plugin = None;
    assert_problem(
        &the_one(&spec(), &facts),
        Severity::Warning,
        "replication slot \"ferry\" is being created by process 4242",
        &["if that is another Ferry, this one will stand by; otherwise wait for it to finish"],
    );
}

#[test]
fn a_physical_slot_is_an_error() {
    let mut facts = healthy();
    let slot = facts.slot.as_mut().unwrap();
    slot.slot_type = "physical".into();
    slot.plugin = None;
    slot.database = None;
    assert_error(
        &the_one(&spec(), &facts),
        "replication slot \"ferry\" is a physical slot with plugin \"none\"; Ferry needs a logical slot with pgoutput",
        &["choose another postgres.slot name (Ferry creates it), or drop this slot if nothing uses it"],
    );
}

#[test]
fn a_slot_of_another_plugin_is_an_error_and_its_database_is_not_judged() {
    let mut facts = healthy();
    let slot = facts.slot.as_mut().unwrap();
    slot.plugin = Some("test_decoding".into());
    slot.database = Some("other".into());
    assert_error(
        &the_one(&spec(), &facts),
        "replication slot \"ferry\" is a logical slot with plugin \"test_decoding\"; Ferry needs a logical slot with pgoutput",
        &["choose another postgres.slot name"],
    );
}

#[test]
fn a_slot_of_another_database_is_an_error() {
    let mut facts = healthy();
    facts.slot.as_mut().unwrap().database = Some("other".into());
    assert_error(
        &the_one(&spec(), &facts),
        "replication slot \"ferry\" belongs to database \"other\", not \"shop\"",
        &["connect to the slot's database, or choose another postgres.slot name"],
    );
}

#[test]
fn an_invalidated_slot_is_an_error_with_the_recovery() {
    let mut facts = healthy();
    facts.slot.as_mut().unwrap().wal_status = Some("lost".into());
    assert_error(
        &the_one(&spec(), &facts),
        "replication slot \"ferry\" was invalidated (wal_status = lost): the WAL it needed was removed, \
         so events after 0/16B3748 are gone from the WAL",
        &[
            "drop it (SELECT pg_drop_replication_slot('ferry')) so Ferry creates a new one",
            "re-publish the lost outbox rows if the table still holds them, and raise max_slot_wal_keep_size",
        ],
    );
}

#[test]
fn a_slot_another_process_streams_is_a_warning() {
    let mut facts = healthy();
    facts.slot.as_mut().unwrap().active_pid = Some(77);
    assert_problem(
        &the_one(&spec(), &facts),
        Severity::Warning,
        "replication slot \"ferry\" is being streamed by process 77",
        &["if that is another Ferry, this one will stand by; otherwise stop that consumer"],
    );
}

// --- failover slots ---

fn failover_spec() -> SlotSpec {
    SlotSpec {
        failover: true,
        ..spec()
    }
}

/// A PostgreSQL 17 primary whose standby streams its slot, with a failover slot.
fn failover_healthy() -> Facts {
    let mut facts = healthy();
    facts.slot.as_mut().unwrap().failover = Some(true);
    facts.failover = Some(FailoverFacts {
        version: 170002,
        in_recovery: false,
        standby_slots: vec![StandbySlot {
            name: "sb1".into(),
            active: Some(true),
        }],
    });
    facts
}

fn failover_facts(facts: &mut Facts) -> &mut FailoverFacts {
    facts.failover.as_mut().unwrap()
}

#[test]
fn a_healthy_failover_setup_has_only_notes() {
    let found = findings(&failover_spec(), &failover_healthy());
    assert_eq!(found.len(), 2, "{found:#?}");
    assert_problem(
        &found[0],
        Severity::Note,
        "replication slot \"ferry\" is a failover slot",
        &["none needed: standbys with sync_replication_slots = on keep a copy of it"],
    );
    assert_problem(
        &found[1],
        Severity::Note,
        "standby slot \"sb1\" (synchronized_standby_slots) is streaming",
        &["none needed"],
    );
}

#[test]
fn a_failover_slot_before_postgresql_17_is_an_error_and_nothing_else_is_judged() {
    let mut facts = failover_healthy();
    *failover_facts(&mut facts) = FailoverFacts {
        version: 160004,
        in_recovery: false,
        standby_slots: vec![],
    };
    assert_error(
        &the_one(&failover_spec(), &facts),
        "postgres.failover_slot needs PostgreSQL 17 or later; this server is 16",
        &["set postgres.failover_slot = false (the slot is then lost on a failover), or upgrade to 17+"],
    );
}

#[test]
fn a_slot_that_is_not_yet_a_failover_slot_is_a_note() {
    let mut facts = failover_healthy();
    facts.slot.as_mut().unwrap().failover = Some(false);
    let found = findings(&failover_spec(), &facts);
    assert_eq!(found.len(), 2, "{found:#?}");
    assert_problem(
        &found[0],
        Severity::Note,
        "replication slot \"ferry\" is not a failover slot",
        &["none needed: Ferry makes it one when it starts streaming (ALTER_REPLICATION_SLOT \"ferry\" (FAILOVER true))"],
    );
}

#[test]
fn a_standbys_synchronized_copy_is_a_note_and_the_standby_slots_are_not_judged() {
    let mut facts = failover_healthy();
    facts.slot.as_mut().unwrap().synced = Some(true);
    *failover_facts(&mut facts) = FailoverFacts {
        version: 170002,
        in_recovery: true,
        standby_slots: vec![],
    };
    assert_problem(
        &the_one(&failover_spec(), &facts),
        Severity::Note,
        "replication slot \"ferry\" is a standby's synchronized copy (this server is a standby)",
        &["none needed: Ferry streams from it once this server is promoted"],
    );
}

#[test]
fn synced_means_a_copy_only_while_in_recovery() {
    let mut facts = failover_healthy();
    let slot = facts.slot.as_mut().unwrap();
    slot.synced = Some(true);
    slot.failover = Some(false);
    let found = findings(&failover_spec(), &facts);
    assert_eq!(
        found[0].what,
        "replication slot \"ferry\" is not a failover slot"
    );
}

#[test]
fn a_missing_slot_gets_no_failover_note() {
    let spec = SlotSpec {
        create_slot: true,
        ..failover_spec()
    };
    let mut facts = failover_healthy();
    facts.slot = None;
    let whats: Vec<String> = findings(&spec, &facts)
        .into_iter()
        .map(|p| p.what)
        .collect();
    assert_eq!(
        whats,
        [
            "replication slot \"ferry\" does not exist",
            "standby slot \"sb1\" (synchronized_standby_slots) is streaming",
        ]
    );
}

#[test]
fn empty_synchronized_standby_slots_is_a_warning_of_phantom_events() {
    let mut facts = failover_healthy();
    failover_facts(&mut facts).standby_slots.clear();
    let found = findings(&failover_spec(), &facts);
    assert_eq!(found.len(), 2, "{found:#?}");
    let p = &found[0];
    assert_eq!(p.severity, Severity::Warning);
    assert!(p.what.starts_with(
        "synchronized_standby_slots is empty: PostgreSQL may send Ferry a transaction no standby has yet"
    ));
    assert!(p
        .what
        .ends_with("although Ferry published it (a phantom event)"));
    assert!(p.fix.starts_with(
        "name the standbys' physical slots: ALTER SYSTEM SET synchronized_standby_slots = 'standby_slot'; SELECT pg_reload_conf()"
    ));
    assert!(p
        .fix
        .contains("sync_replication_slots = on, hot_standby_feedback = on"));
}

#[test]
fn a_standby_slot_with_no_standby_connected_is_a_warning() {
    let mut facts = failover_healthy();
    failover_facts(&mut facts).standby_slots[0].active = Some(false);
    let found = findings(&failover_spec(), &facts);
    assert_eq!(found.len(), 2, "{found:#?}");
    assert_problem(
        &found[0],
        Severity::Warning,
        "standby slot \"sb1\" named in synchronized_standby_slots has no standby connected: \
         PostgreSQL holds back every logical consumer, Ferry too, until it catches up",
        &["start the standby, or remove its slot from synchronized_standby_slots"],
    );
}

#[test]
fn a_standby_slot_that_is_no_physical_slot_is_a_warning() {
    let mut facts = failover_healthy();
    failover_facts(&mut facts).standby_slots.push(StandbySlot {
        name: "sb2".into(),
        active: None,
    });
    let found = findings(&failover_spec(), &facts);
    assert_eq!(found.len(), 3, "{found:#?}");
    assert_problem(
        &found[0],
        Severity::Warning,
        "synchronized_standby_slots names \"sb2\", which is not a physical replication slot here: \
         PostgreSQL holds back every logical consumer, Ferry too",
        &["create it (SELECT pg_create_physical_replication_slot(...)) for the standby, or correct the setting"],
    );
    assert!(found[1..].iter().all(|p| p.severity == Severity::Note));
}

#[test]
fn synchronized_standby_slots_is_read_as_a_list_of_names() {
    assert_eq!(standby_slot_names("sb1"), ["sb1"]);
    assert_eq!(standby_slot_names(" sb1 , \"Sb 2\",,"), ["sb1", "Sb 2"]);
    assert_eq!(standby_slot_names(""), Vec::<&str>::new());
    assert_eq!(standby_slot_names(" , "), Vec::<&str>::new());
}
