//! The machine's protocol, one step at a time. The simulation (`tests/inbox_simulation.rs`)
//! drives it through everything at once; these pin down each rule, and the bugs it found.

use std::time::{Duration, Instant};

use bytes::Bytes;

use super::*;

fn config() -> InboxConfig {
    InboxConfig {
        retry_min: Duration::from_millis(100),
        cleanup_interval: Some(Duration::from_secs(60)),
        ..InboxConfig::default()
    }
}

fn part(n: i32) -> Partition {
    Partition::new("orders", n)
}

fn record(p: i32, offset: i64, epoch: u64, id: Option<&str>, payload: &str) -> InboxRecord {
    InboxRecord {
        partition: part(p),
        offset,
        epoch,
        key: None,
        payload: Some(Bytes::copy_from_slice(payload.as_bytes())),
        headers: id
            .map(|id| {
                (
                    "id".to_string(),
                    Some(Bytes::copy_from_slice(id.as_bytes())),
                )
            })
            .into_iter()
            .collect(),
        timestamp_ms: None,
    }
}

fn actions(m: &mut Inbox) -> Vec<InboxAction> {
    std::iter::from_fn(|| m.poll_action()).collect()
}

fn written(m: &mut Inbox) -> Write {
    let mut writes: Vec<Write> = actions(m)
        .into_iter()
        .filter_map(|a| match a {
            InboxAction::Write(w) => Some(w),
            _ => None,
        })
        .collect();
    assert_eq!(writes.len(), 1, "one write");
    writes.pop().unwrap()
}

fn committed(inserted: u64) -> WriteOutcome {
    WriteOutcome::Committed {
        inserted,
        duplicates: 0,
        dead_lettered: 0,
    }
}

/// A machine holding partitions `parts`, each loaded at `next` and sought: returns the epochs.
fn started(
    config: InboxConfig,
    now: Instant,
    parts: &[i32],
    next: Option<i64>,
) -> (Inbox, Vec<u64>) {
    let mut m = Inbox::new(config, now);
    m.handle_assigned(parts.iter().map(|&p| part(p)).collect(), now);
    let load = match actions(&mut m).as_slice() {
        [InboxAction::Load { load, partitions }] => {
            assert_eq!(partitions.len(), parts.len());
            *load
        }
        a => panic!("{a:?}"),
    };
    let loaded = parts
        .iter()
        .map(|&p| Loaded {
            partition: part(p),
            next,
            marks: Vec::new(),
        })
        .collect();
    m.handle_loaded(load, Ok(loaded), now);
    let epochs = actions(&mut m)
        .into_iter()
        .map(|a| match a {
            InboxAction::Seek { to, epoch, .. } => {
                assert_eq!(to, next.map_or(SeekTo::Start, SeekTo::Offset));
                epoch
            }
            a => panic!("{a:?}"),
        })
        .collect();
    (m, epochs)
}

#[test]
fn load_seek_record_write_commit_offsets() {
    let now = Instant::now();
    let (mut m, e) = started(config(), now, &[0], Some(10));
    assert_eq!(m.active_partitions().collect::<Vec<_>>(), vec![&part(0)]);
    m.handle_record(record(0, 10, e[0], Some("a"), "{}"), now);
    let w = written(&mut m);
    assert_eq!(w.rows.len(), 1);
    assert_eq!(w.rows[0].event_id.as_deref(), Some("a"));
    assert_eq!(
        w.offsets,
        vec![OffsetAdvance {
            partition: part(0),
            expected: Some(10),
            next: 11
        }]
    );
    m.handle_written(w, committed(1), now);
    assert_eq!(
        actions(&mut m),
        vec![InboxAction::CommitOffsets(vec![(part(0), 11)])]
    );
    // The next batch expects what the first one stored.
    m.handle_record(record(0, 13, e[0], Some("b"), "{}"), now);
    let w = written(&mut m);
    assert_eq!((w.offsets[0].expected, w.offsets[0].next), (Some(11), 14));
    assert_eq!(m.stats().inserted, 1);
}

#[test]
fn a_new_partition_starts_where_the_group_starts() {
    let now = Instant::now();
    let (mut m, e) = started(config(), now, &[0], None);
    m.handle_record(record(0, 3, e[0], Some("a"), "{}"), now);
    let w = written(&mut m);
    assert_eq!((w.offsets[0].expected, w.offsets[0].next), (None, 4));
}

#[test]
fn records_of_an_older_epoch_or_below_the_offset_are_dropped() {
    let now = Instant::now();
    let (mut m, e) = started(config(), now, &[0], Some(10));
    m.handle_record(record(0, 10, e[0] - 1, Some("a"), "{}"), now);
    m.handle_record(record(0, 9, e[0], Some("b"), "{}"), now);
    m.handle_record(record(1, 10, e[0], Some("c"), "{}"), now);
    assert_eq!(actions(&mut m), vec![]);
    assert_eq!(m.stats().stale, 3);
    assert_eq!(m.buffered_bytes(), 0);
}

#[test]
fn a_repeated_id_in_a_batch_is_dropped_and_a_payload_not_json_is_a_dead_letter() {
    let now = Instant::now();
    let config = InboxConfig {
        max_batch_delay: Duration::from_millis(5),
        ..config()
    };
    let (mut m, e) = started(config, now, &[0, 1], Some(0));
    m.handle_record(record(0, 0, e[0], Some("a"), "{}"), now);
    m.handle_record(record(1, 0, e[1], Some("a"), "{}"), now);
    m.handle_record(record(0, 1, e[0], Some("b"), "not json"), now);
    assert_eq!(actions(&mut m), vec![]);
    assert_eq!(m.poll_timeout(), Some(now + Duration::from_millis(5)));
    m.handle_timeout(now + Duration::from_millis(5));
    let w = written(&mut m);
    assert_eq!(w.rows.len(), 1);
    assert_eq!(w.rows[0].record.partition, part(0));
    assert_eq!(w.dropped_by_id, 1);
    assert_eq!(w.dead_letters.len(), 1);
    assert!(w.dead_letters[0].reason.contains("not JSON"));
    assert_eq!(
        w.offsets.iter().map(|o| o.next).collect::<Vec<_>>(),
        vec![2, 1]
    );
}

#[test]
fn a_record_at_or_below_its_sources_mark_is_dropped() {
    let now = Instant::now();
    let config = InboxConfig {
        positions: true,
        ..config()
    };
    let mut m = Inbox::new(config, now);
    m.handle_assigned(vec![part(0)], now);
    let [InboxAction::Load { load, .. }] = actions(&mut m)[..] else {
        panic!()
    };
    let mark = SourcePosition::parse(b"0/16B3748:3").unwrap();
    let loaded = Loaded {
        partition: part(0),
        next: Some(0),
        marks: vec![("billing".into(), mark)],
    };
    m.handle_loaded(load, Ok(vec![loaded]), now);
    let [InboxAction::Seek { epoch, .. }] = actions(&mut m)[..] else {
        panic!()
    };
    let with_position = |offset, pos: &str| {
        let mut r = record(0, offset, epoch, None, "{}");
        r.headers
            .push(("ferry-source".into(), Some(Bytes::from_static(b"billing"))));
        r.headers.push((
            "ferry-position".into(),
            Some(Bytes::copy_from_slice(pos.as_bytes())),
        ));
        r
    };
    m.handle_record(with_position(0, "0/16B3748:3"), now);
    let w = written(&mut m);
    assert_eq!((w.rows.len(), w.dropped_by_position), (0, 1));
    assert!(w.marks.is_empty());
    m.handle_written(w, committed(0), now);
    actions(&mut m);
    m.handle_record(with_position(1, "0/16B3748:4"), now);
    let w = written(&mut m);
    assert_eq!((w.rows.len(), w.dropped_by_position), (1, 0));
    assert_eq!(
        w.marks[0].position,
        SourcePosition::parse(b"0/16B3748:4").unwrap()
    );
}

#[test]
fn a_rejected_batch_goes_again_carefully() {
    let now = Instant::now();
    let (mut m, e) = started(config(), now, &[0], Some(0));
    m.handle_record(record(0, 0, e[0], Some("a"), "{}"), now);
    let w = written(&mut m);
    let error = "violates check constraint".to_string();
    m.handle_written(w.clone(), WriteOutcome::Rejected { error }, now);
    let again = written(&mut m);
    assert!(again.careful);
    assert_eq!(
        (again.id, &again.rows, &again.offsets),
        (w.id, &w.rows, &w.offsets)
    );
    assert_eq!(m.stats().careful_writes, 1);
}

#[test]
fn a_failed_write_reloads_after_the_backoff() {
    let now = Instant::now();
    let (mut m, e) = started(config(), now, &[0], Some(0));
    m.handle_record(record(0, 0, e[0], Some("a"), "{}"), now);
    m.handle_record(record(0, 1, e[0], Some("b"), "{}"), now);
    let w = written(&mut m);
    assert_eq!(m.buffered_bytes(), record(0, 1, 0, Some("b"), "{}").size());
    let error = "connection reset".to_string();
    m.handle_written(w, WriteOutcome::Failed { error }, now);
    // Everything in memory is dropped: the database decides.
    assert_eq!(m.buffered_bytes(), 0);
    assert_eq!(actions(&mut m), vec![]);
    assert_eq!(m.active_partitions().count(), 0);
    let at = now + Duration::from_millis(100);
    assert_eq!(m.poll_timeout(), Some(at));
    m.handle_timeout(at - Duration::from_millis(1));
    assert_eq!(actions(&mut m), vec![]);
    m.handle_timeout(at);
    let a = actions(&mut m);
    let [InboxAction::Load { load, partitions }] = &a[..] else {
        panic!("{a:?}")
    };
    let load = *load;
    assert_eq!(partitions, &vec![part(0)]);
    let loaded = Loaded {
        partition: part(0),
        next: Some(1),
        marks: Vec::new(),
    };
    m.handle_loaded(load, Ok(vec![loaded]), at);
    let [InboxAction::Seek { to, epoch, .. }] = actions(&mut m)[..] else {
        panic!()
    };
    assert_eq!(to, SeekTo::Offset(1));
    assert!(epoch > e[0]);
    // What was queued before the seek is not taken.
    m.handle_record(record(0, 2, e[0], Some("c"), "{}"), at);
    assert_eq!(actions(&mut m), vec![]);
    // A second failure waits twice as long.
    m.handle_record(record(0, 1, epoch, Some("b"), "{}"), at);
    let w = written(&mut m);
    m.handle_written(w, WriteOutcome::Failed { error: "x".into() }, at);
    assert_eq!(m.poll_timeout(), Some(at + Duration::from_millis(200)));
}

#[test]
fn a_revoked_partition_with_a_write_in_flight_is_answered_after_it() {
    let now = Instant::now();
    let (mut m, e) = started(config(), now, &[0, 1], Some(0));
    m.handle_record(record(0, 0, e[0], Some("a"), "{}"), now);
    let w = written(&mut m);
    m.handle_revoked(vec![part(0), part(1)], now);
    assert_eq!(actions(&mut m), vec![InboxAction::Revoked(vec![part(1)])]);
    m.handle_written(w, committed(1), now);
    assert_eq!(
        actions(&mut m),
        vec![
            InboxAction::CommitOffsets(vec![(part(0), 1)]),
            InboxAction::Revoked(vec![part(0)])
        ]
    );
}

#[test]
fn a_fenced_write_stops_the_machine() {
    let now = Instant::now();
    let (mut m, e) = started(config(), now, &[0], Some(0));
    m.handle_record(record(0, 0, e[0], Some("a"), "{}"), now);
    let w = written(&mut m);
    m.handle_record(record(0, 1, e[0], Some("b"), "{}"), now);
    let fenced = WriteOutcome::Fenced {
        partition: part(0),
        expected: Some(0),
        found: Some(5),
    };
    m.handle_written(w, fenced, now);
    assert_eq!(
        actions(&mut m),
        vec![InboxAction::Stop(Err(InboxError::Fenced {
            partition: part(0),
            expected: Some(0),
            found: Some(5)
        }))]
    );
    assert!(m.is_stopped());
    assert!(!m.wants_records());
    m.handle_record(record(0, 2, e[0], Some("c"), "{}"), now);
    m.handle_timeout(now + Duration::from_secs(3600));
    assert_eq!(actions(&mut m), vec![]);
}

#[test]
fn a_shutdown_writes_what_is_gathered_then_stops() {
    let now = Instant::now();
    let config = InboxConfig {
        max_batch_records: 1,
        ..config()
    };
    let (mut m, e) = started(config, now, &[0], Some(0));
    m.handle_record(record(0, 0, e[0], Some("a"), "{}"), now);
    m.handle_record(record(0, 1, e[0], Some("b"), "{}"), now);
    let w = written(&mut m);
    m.shutdown(now);
    assert!(!m.wants_records());
    assert_eq!(actions(&mut m), vec![]);
    m.handle_written(w, committed(1), now);
    let mut a = actions(&mut m).into_iter();
    assert_eq!(
        a.next(),
        Some(InboxAction::CommitOffsets(vec![(part(0), 1)]))
    );
    let Some(InboxAction::Write(w)) = a.next() else {
        panic!()
    };
    assert_eq!(w.rows[0].event_id.as_deref(), Some("b"));
    m.handle_written(w, committed(1), now);
    assert_eq!(
        actions(&mut m),
        vec![
            InboxAction::CommitOffsets(vec![(part(0), 2)]),
            InboxAction::Stop(Ok(()))
        ]
    );
}

/// Found by the simulation (`FERRY_SIM_SEED=453771273` without the fix): a zombie learns it lost its partitions while its
/// write to one of them is in flight; the write comes back fenced. The machine stopped and only
/// then answered `Revoked` for that partition: an action after `Stop`.
#[test]
fn a_stop_releases_the_partitions_revoked_while_in_flight_first() {
    let now = Instant::now();
    let (mut m, e) = started(config(), now, &[0], Some(0));
    m.handle_record(record(0, 0, e[0], Some("a"), "{}"), now);
    let w = written(&mut m);
    m.handle_revoked(vec![part(0)], now);
    assert_eq!(actions(&mut m), vec![]);
    let fenced = WriteOutcome::Fenced {
        partition: part(0),
        expected: Some(0),
        found: Some(1),
    };
    m.handle_written(w, fenced, now);
    let a = actions(&mut m);
    assert_eq!(a.len(), 2, "{a:?}");
    assert_eq!(a[0], InboxAction::Revoked(vec![part(0)]));
    assert!(matches!(
        a[1],
        InboxAction::Stop(Err(InboxError::Fenced { .. }))
    ));
}

/// Found by the simulation (`FERRY_SIM_SEED=453771881` without the fix): a machine shutting down with a write in flight
/// passes its cleanup time; it asks for no cleanup while stopping, but `poll_timeout` still
/// answered the cleanup time, already past: a driver sleeping until it would spin until the
/// write came back.
#[test]
fn no_cleanup_time_is_due_while_stopping() {
    let now = Instant::now();
    let (mut m, e) = started(config(), now, &[0], Some(0));
    m.handle_record(record(0, 0, e[0], Some("a"), "{}"), now);
    let _w = written(&mut m);
    m.shutdown(now);
    let later = now + Duration::from_secs(61);
    m.handle_timeout(later);
    assert_eq!(actions(&mut m), vec![]);
    assert!(
        m.poll_timeout().is_none_or(|t| t > later),
        "due at {:?}",
        m.poll_timeout().map(|t| t - now)
    );
}

/// A load that fails while a write is in flight (a partition assigned incrementally, under the
/// cooperative protocol) waits for that write: its retry time must not wake the driver before.
#[test]
fn a_reload_after_a_failed_load_waits_for_the_write_in_flight() {
    let now = Instant::now();
    let (mut m, e) = started(config(), now, &[0], Some(0));
    m.handle_record(record(0, 0, e[0], Some("a"), "{}"), now);
    let w = written(&mut m);
    m.handle_assigned(vec![part(1)], now);
    let load = match actions(&mut m).as_slice() {
        [InboxAction::Load { load, .. }] => *load,
        a => panic!("{a:?}"),
    };
    m.handle_loaded(load, Err("connection lost".into()), now);
    let later = now + Duration::from_secs(1);
    assert!(
        m.poll_timeout().is_none_or(|t| t > later),
        "the retry is not due while the write is in flight: {:?}",
        m.poll_timeout()
    );
    m.handle_timeout(later);
    assert!(
        actions(&mut m).is_empty(),
        "no load before the write's outcome"
    );
    m.handle_written(w, committed(1), later);
    let a = actions(&mut m);
    assert!(
        a.iter()
            .any(|a| matches!(a, InboxAction::Load { partitions, .. } if partitions.len() == 2)),
        "{a:?}"
    );
}
