//! `ferry-bench --instructions a,b`: instructions per row, counted by callgrind, for Ferry and
//! for `pg_recvlogical` on the same fixed WAL.
//!
//! Seconds on a shared machine wander; an instruction count of the same binary on the same
//! input does not (much). For each workload two databases are written once: a small one (S
//! rows) and a big one (S + N rows). Before either backlog is written, every slot the runs will
//! use is created in both (one per contender per run: a slot cannot be rewound), so every run
//! of a contender decodes the same WAL. pgoutput filters by database: each client receives only
//! its database's rows. Each run drains both databases with
//!
//! - `valgrind --tool=callgrind <ferry> run`, with the environment [`crate::ferry::Running`]
//!   gives it (at-least-once, the default settings, the run's codec): the harness polls only
//!   the slot's `confirmed_flush_lsn` (never Ferry's `/metrics`, which would cost Ferry
//!   instructions that depend on wall time) until it reaches the last commit's end, then sends
//!   SIGTERM at once and waits for the exit (callgrind writes its file then);
//! - `valgrind --tool=callgrind pg_recvlogical` with the options of [`crate::recv`], which
//!   exits by itself at the backlog's end.
//!
//! Each file is parsed ([`crate::callgrind`]), self cost summed per function and classified
//! ([`component`]). The difference method separates start-up from per-row cost, per
//! component: per row = (C_big − C_small) / N, fixed = C_small − S × per row.

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use ferry_testkit::kafka as testkafka;
use ferry_testkit::pg;
use ferry_testkit::process::signal;
use ferry_wal::Lsn;

use crate::args::Args;
use crate::callgrind::{self, Func, Profile};
use crate::workload::{thousands, Workload};
use crate::world::{create_db, World};
use crate::{confirmed, current_lsn, drop_slot, kafka, machine, Res, PUBLICATION};

const VALGRIND: &str = "/usr/bin/valgrind";

/// The batching every set of runs is also stated at: Ferry's per-row figure depends on how
/// many rows share a produce request, which follows wall time under callgrind (see
/// [`fit_per_request`]).
const REF_ROWS_PER_REQUEST: f64 = 100.0;

/// Where an instruction goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Component {
    Wal,
    Core,
    Rdkafka,
    Lz4,
    Zstd,
    Alloc,
    Rest,
}

impl Component {
    pub const ALL: [Component; 7] = [
        Component::Wal,
        Component::Core,
        Component::Rdkafka,
        Component::Lz4,
        Component::Zstd,
        Component::Alloc,
        Component::Rest,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Component::Wal => "ferry-wal decode",
            Component::Core => "core and routing",
            Component::Rdkafka => "librdkafka without compression",
            Component::Lz4 => "lz4",
            Component::Zstd => "zstd",
            Component::Alloc => "allocator",
            Component::Rest => "the rest",
        }
    }
}

/// Informative parts of [`Component::Rest`].
pub const DETAILS: [&str; 7] = [
    "memcpy/memset",
    "SCRAM/PBKDF2, sha256",
    "tokio",
    "Ferry's session and producer (ferry::)",
    "rust-rdkafka",
    "std's SipHash (HashMap keys)",
    "locks (pthread, C11 mtx)",
];

/// The crate a demangled Rust name belongs to: `<ferry_wal::x::Y as T>::f` → `ferry_wal`,
/// `core::ptr::drop_in_place<ferry_core::Z>` → `ferry_core`.
fn krate(name: &str) -> &str {
    let mut n = name;
    if let Some(inner) = n.strip_prefix("core::ptr::drop_in_place<") {
        n = inner;
    }
    let n = n.trim_start_matches(['<', '&', '*', '(']);
    let n = n
        .strip_prefix("mut ")
        .or_else(|| n.strip_prefix("dyn "))
        .or_else(|| n.strip_prefix("const "))
        .unwrap_or(n)
        .trim_start_matches(['<', '&']);
    n.split("::").next().unwrap_or(n)
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

fn is_alloc(name: &str, object: &str) -> bool {
    const EXACT: [&str; 12] = [
        "malloc",
        "free",
        "realloc",
        "calloc",
        "cfree",
        "sysmalloc",
        "unlink_chunk",
        "arena_get2",
        "malloc_consolidate",
        "aligned_alloc",
        "posix_memalign",
        "memalign",
    ];
    let libc = basename(object).starts_with("libc.so");
    EXACT.contains(&name)
        || name.starts_with("__rust_alloc")
        || name.starts_with("__rust_dealloc")
        || name.starts_with("__rust_realloc")
        || name.starts_with("__rdl_")
        || name.starts_with("__libc_malloc")
        || name.starts_with("__libc_free")
        || name.starts_with("__libc_calloc")
        || name.starts_with("__libc_realloc")
        || name.starts_with("__libc_memalign")
        // Ferry's glibc settings (`ferry::malloc::tune`, once at start) and the chunk cache in
        // front of glibc (`ferry::malloc::cache`, reached by `--wrap`: round 27, branch
        // `chunk-cache`, bench/README.md)
        || name.starts_with("__wrap_")
        || name.starts_with("ferry::malloc::")
        || (libc
            && (name.starts_with("_int_")
                || name.starts_with("tcache")
                || name.starts_with("malloc")
                || name.starts_with("_mid_memalign")
                || name.ends_with("trim")))
}

/// Whether a function is mimalloc's or jemalloc's, by its file (their inlined helpers have many
/// names): built into the binary from `libmimalloc-sys`' or `tikv-jemalloc-sys`' sources, their
/// `malloc` and `free` overrides included, or a preloaded `libmimalloc.so` / `libjemalloc.so`
/// (`LD_PRELOAD`, which `ferry-bench` passes to Ferry). The allocators round 26 counted
/// (bench/README.md).
fn is_other_allocator(file: &str, object: &str) -> bool {
    let object = basename(object);
    file.contains("/libmimalloc-sys-")
        || file.contains("/mimalloc/src/")
        || file.contains("/include/mimalloc/")
        || file.contains("/tikv-jemalloc-sys-")
        || file.contains("/include/jemalloc/")
        || object.starts_with("libmimalloc")
        || object.starts_with("libjemalloc")
}

/// The component of a function (of Ferry's process, or any other).
pub fn component(f: &Func) -> Component {
    let name = f.name.as_str();
    let file = basename(&f.file);
    let lower_file = file.to_ascii_lowercase();
    if name.starts_with("LZ4")
        || name.starts_with("XXH")
        || lower_file.starts_with("lz4")
        || lower_file == "rdkafka_lz4.c"
        || lower_file.starts_with("xxhash")
    {
        return Component::Lz4;
    }
    if name.starts_with("ZSTD")
        || name.starts_with("HUF_")
        || name.starts_with("FSE_")
        || lower_file.contains("zstd")
        || basename(&f.object).starts_with("libzstd")
    {
        return Component::Zstd;
    }
    if is_alloc(name, &f.object) || is_other_allocator(&f.file, &f.object) {
        return Component::Alloc;
    }
    let k = krate(name);
    if k == "ferry_wal" || f.file.contains("crates/ferry-wal/") {
        return Component::Wal;
    }
    if matches!(k, "ferry_core" | "ferry_router" | "ferry_pgtypes")
        || f.file.contains("crates/ferry-core/")
        || f.file.contains("crates/ferry-router/")
        || f.file.contains("crates/ferry-pgtypes/")
    {
        return Component::Core;
    }
    if name.starts_with("rd_")
        || f.file.contains("librdkafka/src")
        || (f.file.contains("/rdkafka-sys-") && !f.file.ends_with(".rs"))
        || basename(&f.object).starts_with("librdkafka")
    {
        return Component::Rdkafka;
    }
    Component::Rest
}

/// Which informative part of the rest a function is, if any.
pub fn detail(f: &Func) -> Option<usize> {
    if component(f) != Component::Rest {
        return None;
    }
    let name = f.name.as_str();
    let lower = name.to_ascii_lowercase();
    let k = krate(name);
    if ["memcpy", "memmove", "memset", "mempcpy"]
        .iter()
        .any(|m| lower.trim_start_matches('_').starts_with(m))
    {
        Some(0)
    } else if ["sha2", "sha256", "pbkdf2", "scram", "hmac", "compress256"]
        .iter()
        .any(|m| lower.contains(m))
    {
        Some(1)
    } else if k == "tokio" || k == "mio" {
        Some(2)
    } else if k == "ferry" {
        Some(3)
    } else if k == "rdkafka" || k == "rdkafka_sys" {
        Some(4)
    } else if name.contains("core::hash::") || name.contains("std::hash::") {
        Some(5)
    } else if [
        "pthread_mutex",
        "__pthread_mutex",
        "pthread_rwlock",
        "mtx_",
        "pthread_cond",
        "cnd_",
    ]
    .iter()
    .any(|m| name.starts_with(m))
    {
        Some(6)
    } else {
        None
    }
}

/// Whether a function starts work a timer does once per interval of wall time, whatever the
/// rows: librdkafka's statistics, built every `statistics.interval.ms` (1 s in Ferry), and
/// Ferry's reading of them (`stats_raw`).
pub fn is_timer_root(name: &str) -> bool {
    name == "rd_kafka_stats_emit_tmr_cb"
        || (name.starts_with("<ferry::") && name.ends_with("::stats_raw"))
}

/// What a compression call of librdkafka is, by its root: the codec's whole subtree is the
/// codec's, including what it asks of the allocator (a compression context per produce
/// request, its 16 KB hash table cleared by `memset`) and the copies it makes.
pub fn compression_root(name: &str) -> Option<Component> {
    match name {
        "rd_kafka_lz4_compress" => Some(Component::Lz4),
        "rd_kafka_zstd_compress" => Some(Component::Zstd),
        _ => None,
    }
}

/// The functions of the timers' subtrees: the roots, and every function called only from
/// inside (to a fixed point).
fn timer_functions(p: &Profile) -> std::collections::HashSet<String> {
    subtree(p, is_timer_root)
}

/// The functions of the subtrees of the functions `root` picks: the roots, and every function
/// called only from inside (to a fixed point).
fn subtree(p: &Profile, root: impl Fn(&str) -> bool) -> std::collections::HashSet<String> {
    let mut callers: HashMap<&str, Vec<&str>> = HashMap::new();
    for (caller, callee) in p.calls.keys() {
        callers.entry(callee).or_default().push(caller);
    }
    let mut set: std::collections::HashSet<String> = callers
        .keys()
        .copied()
        .chain(p.functions.keys().map(|f| f.name.as_str()))
        .filter(|n| root(n))
        .map(|n| n.to_string())
        .collect();
    loop {
        let before = set.len();
        for (callee, from) in &callers {
            if !set.contains(*callee) && from.iter().all(|c| set.contains(*c)) {
                set.insert(callee.to_string());
            }
        }
        if set.len() == before {
            return set;
        }
    }
}

/// Self costs and calls by function name, to take a call's inclusive cost out of the
/// components it went to.
struct Graph<'a> {
    self_cost: HashMap<&'a str, f64>,
    children: HashMap<&'a str, Vec<(&'a str, f64)>>,
    by_name: &'a HashMap<&'a str, &'a Func>,
}

impl<'a> Graph<'a> {
    fn of(p: &'a Profile, by_name: &'a HashMap<&'a str, &'a Func>) -> Graph<'a> {
        let mut g = Graph {
            self_cost: HashMap::new(),
            children: HashMap::new(),
            by_name,
        };
        for (f, &c) in &p.functions {
            *g.self_cost.entry(&f.name).or_default() += c as f64;
        }
        for ((caller, callee), calls) in &p.calls {
            g.children
                .entry(caller)
                .or_default()
                .push((callee, calls.inclusive as f64));
        }
        g
    }

    /// Takes `c` of `name`'s inclusive cost out of `s` (negative entries): its own share
    /// from its component, its callees' shares from theirs (to `depth` levels; below, from the
    /// callee's own component).
    fn take(
        &self,
        s: &mut Split,
        name: &str,
        c: f64,
        depth: u32,
        add: &impl Fn(&mut Split, &Func, f64),
    ) {
        let rest = Func {
            object: String::new(),
            file: String::new(),
            name: name.to_string(),
        };
        let f = self.by_name.get(name).copied().unwrap_or(&rest);
        let own = self.self_cost.get(name).copied().unwrap_or(0.0);
        let kids = self.children.get(name).map(Vec::as_slice).unwrap_or(&[]);
        let inclusive = own + kids.iter().map(|(_, i)| i).sum::<f64>();
        if depth == 0 || inclusive <= 0.0 || kids.is_empty() {
            add(s, f, -c);
            return;
        }
        add(s, f, -c * own / inclusive);
        for (kid, i) in kids {
            if *kid != name {
                self.take(s, kid, c * i / inclusive, depth - 1, add);
            }
        }
    }
}

/// Costs of one profile by component (and the rest's details), without the timers'
/// subtrees, which are in `timer` (and `timer_runs`: how many statistics were built).
#[derive(Debug, Clone, Default)]
struct Split {
    comps: HashMap<Component, f64>,
    details: [f64; DETAILS.len()],
    total: f64,
    timer: f64,
    timer_runs: u64,
    /// Produce requests (`rd_kafka_ProduceRequest` calls): batches.
    requests: u64,
}

impl Split {
    fn of(p: &Profile) -> Split {
        let mut s = Split::default();
        let timers = timer_functions(p);
        // Each codec's subtree, and the component it goes to.
        let codecs: Vec<(Component, std::collections::HashSet<String>)> =
            [Component::Lz4, Component::Zstd]
                .into_iter()
                .map(|c| (c, subtree(p, |n| compression_root(n) == Some(c))))
                .collect();
        let codec_of = |name: &str| {
            codecs
                .iter()
                .find(|(_, set)| set.contains(name))
                .map(|(c, _)| *c)
        };
        let add = |s: &mut Split, f: &Func, c: f64| {
            *s.comps.entry(component(f)).or_default() += c;
            if let Some(d) = detail(f) {
                s.details[d] += c;
            }
            s.total += c;
        };
        let mut by_name: HashMap<&str, &Func> = HashMap::new();
        for f in p.functions.keys() {
            by_name.entry(&f.name).or_insert(f);
        }
        let graph = Graph::of(p, &by_name);
        for (f, &c) in &p.functions {
            if timers.contains(&f.name) {
                s.timer += c as f64;
            } else if let Some(codec) = codec_of(&f.name) {
                *s.comps.entry(codec).or_default() += c as f64;
                s.total += c as f64;
            } else {
                add(&mut s, f, c as f64);
            }
        }
        // Calls from inside the timers (or a codec) to functions called elsewhere too: their
        // inclusive cost is the timers' (the codec's), taken from the callee's component.
        for ((caller, callee), calls) in &p.calls {
            let c = calls.inclusive as f64;
            let rest = Func {
                object: String::new(),
                file: String::new(),
                name: callee.clone(),
            };
            let callee_f = by_name.get(callee.as_str()).copied().unwrap_or(&rest);
            if timers.contains(caller) && !timers.contains(callee) {
                add(&mut s, callee_f, -c);
                s.timer += c;
            } else if let Some(codec) = codec_of(caller) {
                if codec_of(callee).is_none() && !timers.contains(callee) {
                    // Taken from where the callee's own cost and its callees' went (calloc's
                    // memset is not the allocator's), in the proportions of the whole run.
                    let mut taken = Split::default();
                    graph.take(&mut taken, callee, c, 3, &add);
                    for (comp, v) in taken.comps {
                        *s.comps.entry(comp).or_default() += v;
                    }
                    for (d, v) in taken.details.iter().enumerate() {
                        s.details[d] += v;
                    }
                    s.total += taken.total;
                    *s.comps.entry(codec).or_default() += c;
                    s.total += c;
                }
            }
            if callee == "rd_kafka_stats_emit_tmr_cb" {
                s.timer_runs += calls.count;
            }
            if callee == "rd_kafka_ProduceRequest" {
                s.requests += calls.count;
            }
        }
        s
    }

    fn get(&self, c: Component) -> f64 {
        self.comps.get(&c).copied().unwrap_or(0.0)
    }

    /// (big − small) / n per component; and fixed = small − s × per row.
    fn per_row(small: &Split, big: &Split, s: u64, n: u64) -> (Split, Split) {
        let (n, s) = (n as f64, s as f64);
        let (mut row, mut fixed) = (Split::default(), Split::default());
        for c in Component::ALL {
            let r = (big.get(c) - small.get(c)) / n;
            row.comps.insert(c, r);
            fixed.comps.insert(c, small.get(c) - s * r);
        }
        for i in 0..DETAILS.len() {
            row.details[i] = (big.details[i] - small.details[i]) / n;
            fixed.details[i] = small.details[i] - s * row.details[i];
        }
        row.total = (big.total - small.total) / n;
        fixed.total = small.total - s * row.total;
        (row, fixed)
    }
}

/// `pg_recvlogical`'s costs by object (its binary, libpq, libc, ...).
fn by_object(p: &Profile) -> HashMap<String, f64> {
    let mut out: HashMap<String, f64> = HashMap::new();
    for (f, &c) in &p.functions {
        let o = basename(&f.object);
        let key = if is_alloc(&f.name, &f.object) {
            "libc: allocator".to_string()
        } else if o.starts_with("libc.so") {
            "libc: other".to_string()
        } else if o.starts_with("libssl") || o.starts_with("libcrypto") {
            "OpenSSL (SCRAM)".to_string()
        } else if o.starts_with("ld-linux") || o.is_empty() || o == "???" {
            "the dynamic loader, other".to_string()
        } else {
            o.split(".so").next().unwrap_or(o).to_string()
        };
        *out.entry(key).or_default() += c as f64;
    }
    out
}

/// One run of a workload: four profiles.
struct Run {
    ferry: [Profile; 2],
    recv: [Profile; 2],
    secs: [f64; 4],
}

/// One database of a workload.
struct Db {
    name: String,
    url: String,
    rows: u64,
    /// `pg_current_wal_lsn()` after its backlog: `pg_recvlogical -E`.
    end: Lsn,
    /// The end of its last commit: the position Ferry confirms at the end.
    commit_end: Lsn,
    tag: &'static str,
}

pub async fn run(args: &Args, workloads: &[Workload]) -> Res<()> {
    let started = Instant::now();
    let version = machine::output(VALGRIND, &["--version"]);
    if version.is_empty() || !Path::new(VALGRIND).exists() {
        return Err(format!("--instructions needs valgrind at {VALGRIND}").into());
    }
    kafka::set_compression(&args.compression);
    let ferry_version = machine::output(&crate::ferry::bin()?.to_string_lossy(), &["--version"]);
    let dir = match (&args.instr_files, &args.out) {
        (Some(d), _) => d.clone(),
        (None, Some(d)) => d.join("callgrind"),
        (None, None) => {
            std::env::temp_dir().join(format!("ferry-bench-instr-{}", std::process::id()))
        }
    };
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    // `--instr-files DIR`: the report of the files an earlier run left in DIR.
    let mut servers = None;
    let postgres: String = match &args.instr_files {
        Some(_) => "(not started: --instr-files)".into(),
        None => {
            let world = World::start().await?;
            let admin = pg::connect(&world.admin_url).await;
            let v = admin.query_one("SHOW server_version", &[]).await?.get(0);
            servers = Some((world, admin));
            v
        }
    };
    let head = format!(
        "Instructions counted by callgrind ({version}); {ferry_version}; PostgreSQL {postgres}; \
         compression {}; S = {} rows (small database), N = {} rows (the big one has S + N); {} \
         run(s); `{}`; {}",
        kafka::compression(),
        thousands(args.instr_small),
        thousands(args.instr_rows),
        args.instr_runs,
        args.command,
        machine::output("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
    );
    println!(
        "ferry-bench --instructions: {head}\n  callgrind files in {}",
        dir.display()
    );
    let mut sections = Vec::new();
    let mut summary = Vec::new();
    for (i, w) in workloads.iter().enumerate() {
        let runs = match &mut servers {
            Some((world, admin)) => {
                if i > 0 {
                    // A fresh broker per workload: the local one keeps every record in memory.
                    world.fresh_broker().await;
                }
                workload_runs(args, world, admin, w, i, &dir).await?
            }
            None => (0..args.instr_runs)
                .map(|r| {
                    let f = |who: &str, tag: &str| read(&file(&dir, w, who, tag, r));
                    Ok(Run {
                        ferry: [f("ferry", "s")?, f("ferry", "b")?],
                        recv: [f("recv", "s")?, f("recv", "b")?],
                        secs: [f64::NAN; 4],
                    })
                })
                .collect::<Res<Vec<Run>>>()?,
        };
        let (section, line) = report(args, w, &runs);
        println!("\n{section}");
        sections.push(section);
        summary.push(line);
    }
    let md = format!(
        "## Instructions per row\n\n{head}\n\n\
         | workload | Ferry Ir/row | without lz4 | `pg_recvlogical` Ir/row | Ferry / `pg_recvlogical` | without lz4 | Ferry fixed (M Ir) | `pg_recvlogical` fixed (M Ir) | Ferry Ir/row over runs: min–max (spread) | Ferry Ir/row at {REF_ROWS_PER_REQUEST} rows per request (fitted) |\n\
         |---|--:|--:|--:|--:|--:|--:|--:|---|--:|\n{}\n\n{}",
        summary.join("\n"),
        sections.join("\n\n")
    );
    println!("\n{md}");
    if let Some(out) = &args.out {
        std::fs::write(out.join("instructions.md"), &md)?;
        println!("wrote {}/instructions.md", out.display());
    }
    println!("done in {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

async fn workload_runs(
    args: &Args,
    world: &mut World,
    admin: &tokio_postgres::Client,
    w: &Workload,
    index: usize,
    dir: &Path,
) -> Res<Vec<Run>> {
    println!("\n[{}] {}", w.name, w.describe());
    let (s, n) = (args.instr_small, args.instr_rows);
    let mut dbs = Vec::new();
    for (tag, rows) in [("s", s), ("b", s + n)] {
        let shape = Workload { rows, ..w.clone() };
        let (name, url) = create_db(admin, world, &shape).await?;
        dbs.push((shape, name, url, tag));
    }
    let slot = |tag: &str, who: &str, run: u32| format!("instr_{index}{tag}_{who}_{run}");
    // Every slot first (and a probe that finds the last commit's end), then the backlogs.
    let mut clients = Vec::new();
    for (_, _, url, tag) in &dbs {
        let sql = pg::connect(url).await;
        let mut names = vec![slot(tag, "probe", 0)];
        for r in 0..args.instr_runs {
            names.push(slot(tag, "ferry", r));
            names.push(slot(tag, "recv", r));
        }
        for name in &names {
            sql.execute(
                "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
                &[name],
            )
            .await?;
        }
        clients.push(sql);
    }
    let mut out = Vec::new();
    for ((shape, name, url, tag), sql) in dbs.into_iter().zip(&clients) {
        let took = shape.insert(sql).await?;
        let end = current_lsn(sql).await?;
        let (rows, bytes) = crate::workload::measure(sql, w.kind).await?;
        if rows != shape.rows {
            return Err(
                format!("[{}] {rows} rows written, expected {}", w.name, shape.rows).into(),
            );
        }
        println!(
            "[{}] database {tag}: wrote {} rows ({:.1} MB of payload) in {:.1} s",
            w.name,
            thousands(rows),
            bytes as f64 / 1e6,
            took.as_secs_f64()
        );
        out.push(Db {
            name,
            url,
            rows,
            end,
            commit_end: Lsn(0),
            tag,
        });
    }
    clients[0].batch_execute("CHECKPOINT").await?;
    for (db, sql) in out.iter_mut().zip(&clients) {
        let probe = slot(db.tag, "probe", 0);
        // pgoutput's Commit message: 'C', flags, the commit's LSN, its end LSN, a timestamp.
        let e: Option<i64> = sql
            .query_one(
                "SELECT max(('x' || encode(substring(data from 11 for 8), 'hex'))::bit(64)::bigint) \
                 FROM pg_logical_slot_peek_binary_changes($1, $2::text::pg_lsn, NULL, \
                   'proto_version', '1', 'publication_names', $3) \
                 WHERE get_byte(data, 0) = 67",
                &[&probe, &db.end.to_string(), &PUBLICATION],
            )
            .await?
            .get(0);
        db.commit_end = Lsn(e.ok_or("the probe slot found no commit")? as u64);
        drop_slot(sql, &probe).await?;
    }
    let mut runs = Vec::new();
    for r in 0..args.instr_runs {
        let mut run = Run {
            ferry: [Profile::default(), Profile::default()],
            recv: [Profile::default(), Profile::default()],
            secs: [0.0; 4],
        };
        for (i, (db, sql)) in out.iter().zip(&clients).enumerate() {
            let file = file(dir, w, "ferry", db.tag, r);
            let t = Instant::now();
            let topic = format!("order.{}.instr-{}{r}", w.name, db.tag);
            testkafka::create_topic(&world.brokers(), &topic, kafka::PARTITIONS).await;
            ferry_run(
                &db.url,
                &world.brokers(),
                sql,
                &slot(db.tag, "ferry", r),
                &format!("{{aggregatetype}}.{}.instr-{}{r}", w.name, db.tag),
                db.commit_end,
                &file,
            )
            .await?;
            run.secs[i] = t.elapsed().as_secs_f64();
            run.ferry[i] = read(&file)?;
            let file = self::file(dir, w, "recv", db.tag, r);
            let t = Instant::now();
            recv_run(&db.url, &slot(db.tag, "recv", r), db.end, w, &file).await?;
            run.secs[2 + i] = t.elapsed().as_secs_f64();
            run.recv[i] = read(&file)?;
            println!(
                "[{}] run {}/{} database {} ({} rows): Ferry {} Ir ({:.0} s under callgrind), pg_recvlogical {} Ir ({:.0} s)",
                w.name,
                r + 1,
                args.instr_runs,
                db.tag,
                thousands(db.rows),
                thousands(run.ferry[i].total()),
                run.secs[i],
                thousands(run.recv[i].total()),
                run.secs[2 + i],
            );
        }
        runs.push(run);
    }
    drop(clients);
    for db in &out {
        admin
            .batch_execute(&format!("DROP DATABASE {} WITH (FORCE)", db.name))
            .await?;
    }
    Ok(runs)
}

/// A callgrind file of a run: `<workload>.<ferry|recv>.<s|b>.<run>.out`.
fn file(dir: &Path, w: &Workload, who: &str, tag: &str, run: u32) -> std::path::PathBuf {
    dir.join(format!("{}.{who}.{tag}.{run}.out", w.name))
}

fn read(file: &Path) -> Res<Profile> {
    let bytes = std::fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?;
    Ok(callgrind::parse(&bytes).map_err(|e| format!("{}: {e}", file.display()))?)
}

fn callgrind_wrapper(file: &Path) -> Vec<String> {
    vec![
        VALGRIND.into(),
        "--tool=callgrind".into(),
        format!("--callgrind-out-file={}", file.display()),
        "--quiet".into(),
    ]
}

/// With every record confirmed but the slot short of the last commit's end (it should not
/// be), how long the confirmed LSN may stand still before the run ends anyway.
const SETTLE: Duration = Duration::from_secs(20);
/// Generous limits: callgrind runs a program ~50× slower.
const LIMIT: Duration = Duration::from_secs(1800);

/// Ferry under callgrind until the slot confirms `commit_end`, then SIGTERM and the exit.
async fn ferry_run(
    db_url: &str,
    brokers: &str,
    sql: &tokio_postgres::Client,
    slot: &str,
    topic: &str,
    commit_end: Lsn,
    file: &Path,
) -> Res<()> {
    let _ = std::fs::remove_file(file);
    let start = Instant::now();
    let mut ferry =
        crate::ferry::Running::spawn_under(&callgrind_wrapper(file), db_url, brokers, slot, topic)?;
    let initial = confirmed(sql, slot).await?;
    let (mut last, mut last_at) = (initial, Instant::now());
    loop {
        let c = confirmed(sql, slot).await?;
        if c >= commit_end {
            break;
        }
        if c > last {
            (last, last_at) = (c, Instant::now());
        }
        ferry.check_alive()?;
        if last > initial && last_at.elapsed() > SETTLE {
            eprintln!("  (ferry confirmed {last}, short of {commit_end}: ending the run there)");
            break;
        }
        if start.elapsed() > LIMIT {
            return Err(
                format!("ferry under callgrind did not confirm {commit_end} in {LIMIT:?}").into(),
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    signal(&ferry.child, libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        if let Some(status) = ferry.child.try_wait()? {
            if !status.success() {
                eprintln!("  (ferry under callgrind exited with {status})");
            }
            break;
        }
        if Instant::now() > deadline {
            signal(&ferry.child, libc::SIGKILL);
            return Err("ferry under callgrind did not exit within 600 s of SIGTERM".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// `pg_recvlogical` under callgrind, with [`crate::recv`]'s options, to `end`.
async fn recv_run(db_url: &str, slot: &str, end: Lsn, w: &Workload, file: &Path) -> Res<()> {
    let _ = std::fs::remove_file(file);
    let binary = w.kind == crate::workload::Kind::Bytea;
    let out = tokio::process::Command::new(VALGRIND)
        .args(&callgrind_wrapper(file)[1..])
        .arg(pg::pg_bindir().join("pg_recvlogical"))
        .args(crate::recv::args(db_url, slot, end, binary))
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(LIMIT, out)
        .await
        .map_err(|_| "pg_recvlogical under callgrind did not finish")??;
    if !out.status.success() {
        return Err(format!("pg_recvlogical: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(())
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// "1,234 (1,200–1,260, 4.9%)".
fn spread(v: &[f64]) -> String {
    let (lo, hi) = v
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
            (a.min(x), b.max(x))
        });
    let m = median(v);
    if v.len() < 2 {
        return "one run".into();
    }
    format!(
        "{}–{} ({:.2}% of the median)",
        int(lo),
        int(hi),
        (hi - lo) / m.abs().max(1e-9) * 100.0
    )
}

fn int(x: f64) -> String {
    if x < 0.0 {
        format!("−{}", thousands((-x).round() as u64))
    } else {
        thousands(x.round() as u64)
    }
}

fn mega(x: f64) -> String {
    format!("{:.1}", if x.abs() < 5e4 { 0.0 } else { x / 1e6 })
}

/// The workload's section and its line of the summary table.
fn report(args: &Args, w: &Workload, runs: &[Run]) -> (String, String) {
    let (s, n) = (args.instr_small, args.instr_rows);
    let raw: Vec<(Split, Split)> = runs
        .iter()
        .map(|r| (Split::of(&r.ferry[0]), Split::of(&r.ferry[1])))
        .collect();
    let ferry: Vec<(Split, Split)> = raw
        .iter()
        .map(|(a, b)| Split::per_row(a, b, s, n))
        .collect();
    let recv: Vec<(f64, f64)> = runs
        .iter()
        .map(|r| {
            let (a, b) = (r.recv[0].total() as f64, r.recv[1].total() as f64);
            let row = (b - a) / n as f64;
            (row, a - s as f64 * row)
        })
        .collect();
    let col = |f: &dyn Fn(&(Split, Split)) -> f64| -> Vec<f64> { ferry.iter().map(f).collect() };
    let mut md = format!(
        "### {} ({}; S = {}, N = {}, {} run(s): medians, min–max)\n\n\
         | Ferry | Ir per row | min–max over runs | fixed start-up (M Ir) |\n|---|--:|--:|--:|\n",
        w.name,
        w.describe().split(", ").last().unwrap_or(""),
        thousands(s),
        thousands(n),
        runs.len()
    );
    let mut line = |label: &str, rows: Vec<f64>, fixed: Vec<f64>| {
        md += &format!(
            "| {label} | {} | {} | {} |\n",
            int(median(&rows)),
            spread(&rows),
            mega(median(&fixed))
        );
    };
    for c in Component::ALL {
        if c == Component::Zstd && kafka::compression() != "zstd" {
            continue;
        }
        line(c.label(), col(&|(r, _)| r.get(c)), col(&|(_, f)| f.get(c)));
        if c == Component::Rest {
            for (i, d) in DETAILS.iter().enumerate() {
                line(
                    &format!("  of which {d}"),
                    col(&|(r, _)| r.details[i]),
                    col(&|(_, f)| f.details[i]),
                );
            }
        }
    }
    let no_lz4 = |x: &Split| x.total - x.get(Component::Lz4) - x.get(Component::Zstd);
    let total = col(&|(r, _)| r.total);
    let total_nolz4 = col(&|(r, _)| no_lz4(r));
    line("**total**", total.clone(), col(&|(_, f)| f.total));
    line(
        "total without compression",
        total_nolz4.clone(),
        col(&|(_, f)| no_lz4(f)),
    );
    // Produce requests differ between runs with the machine's load (a batch closes on a 1 ms
    // linger of wall time, and callgrind's pace follows the CPU it gets): each run's total at
    // the median batching, with the cost of a request fitted over every database of every run.
    let per_request = fit_per_request(&raw, s, n);
    let mut md_extra = String::new();
    let mut at_ref = None;
    let dreq: Vec<f64> = raw
        .iter()
        .map(|(a, b)| b.requests as f64 - a.requests as f64)
        .collect();
    let dmed = median(&dreq);
    let adjusted: Vec<f64> = match per_request {
        Some(b) => total
            .iter()
            .zip(&dreq)
            .map(|(t, d)| t - b * (d - dmed) / n as f64)
            .collect(),
        None => total.clone(),
    };
    if let (Some(b), Some([_, a, _])) = (per_request, fit(&raw, s, n)) {
        md_extra = format!(
            "\nFitted over the {} databases: {} Ir per row with the produce requests taken out, \
             {} Ir per produce request; at a fixed {REF_ROWS_PER_REQUEST} rows per produce \
             request (for comparing sets of runs and builds): **{}** Ir per row.\n",
            raw.len() * 2,
            int(a),
            int(b),
            int(a + b / REF_ROWS_PER_REQUEST)
        );
        at_ref = Some(a + b / REF_ROWS_PER_REQUEST);
        line(
            &format!(
                "total at the median batching ({:.0} rows per produce request; {} Ir per request, fitted)",
                n as f64 / dmed.max(1.0),
                int(b)
            ),
            adjusted.clone(),
            col(&|(_, f)| f.total),
        );
    }
    let recv_rows: Vec<f64> = recv.iter().map(|x| x.0).collect();
    let recv_fixed: Vec<f64> = recv.iter().map(|x| x.1).collect();
    line(
        "`pg_recvlogical`, total",
        recv_rows.clone(),
        recv_fixed.clone(),
    );
    let ratio: Vec<f64> = total.iter().zip(&recv_rows).map(|(a, b)| a / b).collect();
    let ratio_nolz4: Vec<f64> = total_nolz4
        .iter()
        .zip(&recv_rows)
        .map(|(a, b)| a / b)
        .collect();
    let minmax = |v: &[f64]| {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        format!("{lo:.2}–{hi:.2}")
    };
    md += &format!(
        "| Ferry / `pg_recvlogical` per row | {:.2}× | {} | |\n\
         | Ferry without compression / `pg_recvlogical` | {:.2}× | {} | |\n",
        median(&ratio),
        minmax(&ratio),
        median(&ratio_nolz4),
        minmax(&ratio_nolz4)
    );
    md += &md_extra;
    // pg_recvlogical by object.
    let objs: Vec<(HashMap<String, f64>, HashMap<String, f64>)> = runs
        .iter()
        .map(|r| (by_object(&r.recv[0]), by_object(&r.recv[1])))
        .collect();
    let mut keys: Vec<String> = objs
        .iter()
        .flat_map(|(a, b)| a.keys().chain(b.keys()).cloned())
        .collect();
    keys.sort();
    keys.dedup();
    let mut rows: Vec<(String, f64, f64)> = keys
        .into_iter()
        .map(|k| {
            let get = |m: &HashMap<String, f64>| m.get(&k).copied().unwrap_or(0.0);
            let per_row: Vec<f64> = objs
                .iter()
                .map(|(a, b)| (get(b) - get(a)) / n as f64)
                .collect();
            let fixed: Vec<f64> = objs
                .iter()
                .zip(&per_row)
                .map(|((a, _), r)| get(a) - s as f64 * r)
                .collect();
            (k, median(&per_row), median(&fixed))
        })
        .collect();
    rows.sort_by(|a, b| b.1.total_cmp(&a.1));
    md += "\n| `pg_recvlogical` by object | Ir per row | fixed (M Ir) |\n|---|--:|--:|\n";
    for (k, r, f) in rows.iter().filter(|x| x.1.abs() >= 0.5 || x.2.abs() >= 1e5) {
        md += &format!("| {k} | {} | {} |\n", int(*r), mega(*f));
    }
    // Each run.
    md += "\n| run | Ferry Ir/row | without compression | fixed (M Ir) | `pg_recvlogical` Ir/row | fixed (M Ir) | ratio | produce requests (S, B) | statistics built (S, B): M Ir left out | seconds under callgrind (Ferry S, B; recv S, B) |\n|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n";
    for (i, (((row, fixed), run), (rs, rb))) in ferry.iter().zip(runs).zip(&raw).enumerate() {
        md += &format!(
            "| {} | {} | {} | {} | {} | {} | {:.2}× | {}, {} | {}, {}: {}, {} | {} |\n",
            i + 1,
            int(row.total),
            int(no_lz4(row)),
            mega(fixed.total),
            int(recv[i].0),
            mega(recv[i].1),
            row.total / recv[i].0,
            rs.requests,
            rb.requests,
            rs.timer_runs,
            rb.timer_runs,
            mega(rs.timer),
            mega(rb.timer),
            match run.secs[0].is_nan() {
                true => "(--instr-files)".to_string(),
                false => format!(
                    "{:.0}, {:.0}; {:.0}, {:.0}",
                    run.secs[0], run.secs[1], run.secs[2], run.secs[3]
                ),
            }
        );
    }
    // The top functions per row, of the median run.
    let mid = {
        let mut idx: Vec<usize> = (0..runs.len()).collect();
        idx.sort_by(|&a, &b| ferry[a].0.total.total_cmp(&ferry[b].0.total));
        idx[idx.len() / 2]
    };
    md += &format!(
        "\nFerry's top functions by self instructions per row (run {}; (big − small) / N):\n\n\
         | function | component | Ir per row |\n|---|---|--:|\n",
        mid + 1
    );
    for (f, r) in top(&runs[mid].ferry[0], &runs[mid].ferry[1], n, 15) {
        let c = match detail(&f) {
            Some(d) => DETAILS[d],
            None => component(&f).label(),
        };
        let mut name = f.name.replace('|', "\\|");
        if name.chars().count() > 110 {
            name = name.chars().take(107).collect::<String>() + "...";
        }
        md += &format!("| `{name}` | {c} | {} |\n", int(r));
    }
    let summary = format!(
        "| {} | {} | {} | {} | {:.2}× | {:.2}× | {} | {} | {}; at the median batching {} | {} |",
        w.name,
        int(median(&total)),
        int(median(&total_nolz4)),
        int(median(&recv_rows)),
        median(&ratio),
        median(&ratio_nolz4),
        mega(median(&col(&|(_, f)| f.total))),
        mega(median(&recv_fixed)),
        spread(&total),
        spread(&adjusted),
        at_ref.map_or("(one run)".to_string(), int)
    );
    (md, summary)
}

/// The cost of one produce request: `Ir = F + a × rows + b × requests` fitted by least squares
/// over both databases of every run; `None` when the requests do not vary enough to tell, or
/// the fit says nothing sensible (b ≤ 0).
fn fit_per_request(raw: &[(Split, Split)], s: u64, n: u64) -> Option<f64> {
    fit(raw, s, n).map(|f| f[2])
}

/// `[F, a, b]` of `Ir = F + a × rows + b × requests` (see [`fit_per_request`]).
fn fit(raw: &[(Split, Split)], s: u64, n: u64) -> Option<[f64; 3]> {
    let points: Vec<[f64; 3]> = raw
        .iter()
        .flat_map(|(a, b)| {
            [
                [s as f64, a.requests as f64, a.total],
                [(s + n) as f64, b.requests as f64, b.total],
            ]
        })
        .collect();
    if points.len() < 4 {
        return None;
    }
    // Normal equations for (F, a, b).
    let mut m = [[0.0f64; 4]; 3];
    for p in &points {
        let x = [1.0, p[0], p[1]];
        for i in 0..3 {
            for j in 0..3 {
                m[i][j] += x[i] * x[j];
            }
            m[i][3] += x[i] * p[2];
        }
    }
    let sol = solve3(m)?;
    (sol[2] > 0.0).then_some(sol)
}

/// Gaussian elimination with partial pivoting on an augmented 3×4 matrix.
fn solve3(mut m: [[f64; 4]; 3]) -> Option<[f64; 3]> {
    for col in 0..3 {
        let pivot = (col..3).max_by(|&a, &b| m[a][col].abs().total_cmp(&m[b][col].abs()))?;
        m.swap(col, pivot);
        let scale = m.iter().map(|r| r[col].abs()).fold(0.0, f64::max);
        if m[col][col].abs() <= scale * 1e-9 || m[col][col] == 0.0 {
            return None;
        }
        let p = m[col];
        for (r, row) in m.iter_mut().enumerate() {
            if r != col {
                let f = row[col] / p[col];
                for (x, y) in row.iter_mut().zip(p).skip(col) {
                    *x -= f * y;
                }
            }
        }
    }
    Some([m[0][3] / m[0][0], m[1][3] / m[1][1], m[2][3] / m[2][2]])
}

/// Functions by (big − small) / n self cost, largest first (without the timers' own).
fn top(small: &Profile, big: &Profile, n: u64, k: usize) -> Vec<(Func, f64)> {
    let mut m: HashMap<Func, f64> = HashMap::new();
    let timers = timer_functions(big);
    for (f, &c) in &big.functions {
        *m.entry(f.clone()).or_default() += c as f64;
    }
    for (f, &c) in &small.functions {
        *m.entry(f.clone()).or_default() -= c as f64;
    }
    m.retain(|f, _| !timers.contains(&f.name));
    let mut v: Vec<(Func, f64)> = m.into_iter().map(|(f, c)| (f, c / n as f64)).collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1));
    v.truncate(k);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(object: &str, file: &str, name: &str) -> Func {
        Func {
            object: object.into(),
            file: file.into(),
            name: name.into(),
        }
    }

    #[test]
    fn functions_fall_into_components() {
        let bin = "/x/target/release/ferry";
        let libc = "/usr/lib/x86_64-linux-gnu/libc.so.6";
        let rk = "/r/rdkafka-sys-4.9.0/librdkafka/src";
        assert_eq!(
            component(&f(
                bin,
                "/w/crates/ferry-wal/src/pgoutput.rs",
                "ferry_wal::pgoutput::decode"
            )),
            Component::Wal
        );
        assert_eq!(
            component(&f(
                bin,
                "x.rs",
                "<ferry_router::Router as core::fmt::Debug>::fmt"
            )),
            Component::Core
        );
        assert_eq!(
            component(&f(
                bin,
                "x.rs",
                "core::ptr::drop_in_place<ferry_core::relay::Relay>"
            )),
            Component::Core
        );
        assert_eq!(
            component(&f(bin, &format!("{rk}/rdkafka_msg.c"), "rd_kafka_msg_new")),
            Component::Rdkafka
        );
        assert_eq!(
            component(&f(
                bin,
                &format!("{rk}/lz4.c"),
                "LZ4_compress_fast_extState_fastReset"
            )),
            Component::Lz4
        );
        assert_eq!(
            component(&f(bin, &format!("{rk}/xxhash.c"), "XXH32_update")),
            Component::Lz4
        );
        assert_eq!(
            component(&f(libc, "./malloc/malloc.c", "_int_free")),
            Component::Alloc
        );
        assert_eq!(component(&f(bin, "", "__rust_alloc")), Component::Alloc);
        let mi = "/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/libmimalloc-sys-0.1.49/c_src/mimalloc/v3";
        assert_eq!(
            component(&f(bin, &format!("{mi}/src/page.c"), "_mi_malloc_generic")),
            Component::Alloc
        );
        assert_eq!(
            component(&f(
                bin,
                &format!("{mi}/include/mimalloc/internal.h"),
                "free"
            )),
            Component::Alloc
        );
        assert_eq!(component(&f(bin, "", "__wrap_free")), Component::Alloc);
        assert_eq!(
            component(&f(bin, "", "ferry::malloc::cache::Lists::push")),
            Component::Alloc
        );
        let preloaded = "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2.0";
        assert_eq!(component(&f(preloaded, "???", "mi_free")), Component::Alloc);
        let je = "target/release/build/tikv-jemalloc-sys-f687bc5b1739903c/out/build";
        assert_eq!(
            component(&f(
                bin,
                &format!("{je}/src/arena.c"),
                "_rjem_je_arena_ptr_array_flush"
            )),
            Component::Alloc
        );
        assert_eq!(
            component(&f(libc, "memmove.S", "__memcpy_avx_unaligned_erms")),
            Component::Rest
        );
        assert_eq!(
            detail(&f(libc, "memmove.S", "__memcpy_avx_unaligned_erms")),
            Some(0)
        );
        assert_eq!(detail(&f(bin, "", "sha2::sha256::soft::compress")), Some(1));
        assert_eq!(detail(&f(bin, "", "tokio::runtime::park::wake")), Some(2));
        assert_eq!(
            detail(&f(bin, "", "ferry::pipeline::session::run")),
            Some(3)
        );
        assert_eq!(
            detail(&f(bin, "", "core::hash::BuildHasher::hash_one")),
            Some(5)
        );
        assert_eq!(
            detail(&f(libc, "", "pthread_mutex_lock@@GLIBC_2.2.5")),
            Some(6)
        );
    }

    #[test]
    fn the_statistics_timer_is_left_out_by_the_call_graph() {
        let bin = "/x/ferry";
        let libc = "/usr/lib/x86_64-linux-gnu/libc.so.6";
        let mut p = Profile::default();
        let mut cost = |o: &str, file: &str, n: &str, c: u64| {
            p.functions.insert(f(o, file, n), c);
        };
        cost(
            bin,
            "/w/crates/ferry-wal/src/a.rs",
            "ferry_wal::decode",
            1000,
        );
        cost(bin, "rdkafka_timer.c", "rd_kafka_timers_run", 10);
        cost(bin, "rdkafka.c", "rd_kafka_stats_emit_tmr_cb", 300);
        // Called only from the statistics: theirs whole.
        cost(bin, "rdhdrhistogram.c", "rd_hdr_iter_next", 500);
        // Called from both: only the calls from the statistics are theirs.
        cost(libc, "malloc.c", "malloc", 70);
        let mut call = |from: &str, to: &str, count: u64, inclusive: u64| {
            p.calls.insert(
                (from.into(), to.into()),
                callgrind::Calls { count, inclusive },
            );
        };
        call("rd_kafka_timers_run", "rd_kafka_stats_emit_tmr_cb", 3, 900);
        call("rd_kafka_stats_emit_tmr_cb", "rd_hdr_iter_next", 50, 500);
        call("rd_kafka_stats_emit_tmr_cb", "malloc", 4, 40);
        call("ferry_wal::decode", "malloc", 3, 30);
        let t = timer_functions(&p);
        assert!(t.contains("rd_hdr_iter_next") && t.contains("rd_kafka_stats_emit_tmr_cb"));
        assert!(!t.contains("malloc") && !t.contains("rd_kafka_timers_run"));
        let s = Split::of(&p);
        assert_eq!(s.timer, 300.0 + 500.0 + 40.0);
        assert_eq!(s.timer_runs, 3);
        assert_eq!(s.get(Component::Alloc), 30.0);
        assert_eq!(s.get(Component::Wal), 1000.0);
        assert_eq!(s.get(Component::Rdkafka), 10.0);
        assert_eq!(s.total, 1040.0);
    }

    #[test]
    fn the_difference_method() {
        let p = |c: u64| {
            let mut p = Profile::default();
            p.functions.insert(f("o", "x.rs", "ferry_wal::a"), c);
            p
        };
        // 1,000 rows cost 5M + 1,000 × 300; 21,000 rows 5M + 21,000 × 300.
        let (small, big) = (Split::of(&p(5_300_000)), Split::of(&p(11_300_000)));
        let (row, fixed) = Split::per_row(&small, &big, 1000, 20_000);
        assert_eq!(row.get(Component::Wal), 300.0);
        assert_eq!(fixed.get(Component::Wal), 5_000_000.0);
        assert_eq!(row.total, 300.0);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0]), 2.5);
        // 5M + 300 per row + 100,000 per request, on four databases.
        let split = |rows: u64, req: u64| Split {
            total: 5e6 + 300.0 * rows as f64 + 1e5 * req as f64,
            requests: req,
            ..Split::default()
        };
        let raw = vec![
            (split(1000, 13), split(21_000, 232)),
            (split(1000, 35), split(21_000, 287)),
        ];
        let b = fit_per_request(&raw, 1000, 20_000).unwrap();
        assert!((b - 1e5).abs() < 1e-3, "{b}");
        // Requests in proportion to rows: nothing to tell them apart.
        let raw = vec![(split(1000, 10), split(21_000, 210)); 2];
        assert_eq!(fit_per_request(&raw, 1000, 20_000), None);
    }
}
