//! The consumer of the no-Docker demo (`demo/run-local.sh`): waits for a broker, creates the
//! demo's topics, and prints the records Ferry produces, so the demo shows events arriving without
//! kcat or the Kafka CLI on the machine.
//!
//! ```text
//! ferry-demo-consumer --brokers 127.0.0.1:9092 --topics outbox.event.order,outbox.event.customer \
//!     [--create-topics] [--prepare-only] [--count N] [--timeout SECS]
//! ```
//!
//! - It first waits (up to `--timeout`, default 60 s) until the broker answers a metadata
//!   request: the script starts it right after the broker process, with no race.
//! - `--create-topics` creates every topic (3 partitions, replication factor 1) if missing and waits
//!   until the broker reports all partitions; `--prepare-only` exits 0 there.
//! - Then it reads every partition from the beginning and prints one line per record:
//!   topic, partition@offset, key, the `type` and `id` headers, the value.
//! - `--count N` exits 0 once N records were read, or 1 when `--timeout` passes first (saying how
//!   many arrived). Without it, it reads until killed.
//!
//! Exit codes: 0 done, 1 timed out or the broker failed, 2 bad arguments.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use ferry_testkit::kafka;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::TopicPartitionList;

/// Partitions of the topics `--create-topics` makes (the docker-compose demo uses 3 as well).
const DEMO_PARTITIONS: i32 = 3;

#[derive(Debug)]
struct Args {
    brokers: String,
    topics: Vec<String>,
    create_topics: bool,
    prepare_only: bool,
    count: Option<usize>,
    timeout: Duration,
}

const USAGE: &str = "usage: ferry-demo-consumer --brokers HOST:PORT --topics T1,T2 \
                     [--create-topics] [--prepare-only] [--count N] [--timeout SECS]";

fn parse_args(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut a = Args {
        brokers: String::new(),
        topics: Vec::new(),
        create_topics: false,
        prepare_only: false,
        count: None,
        timeout: Duration::from_secs(60),
    };
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--brokers" => a.brokers = value()?,
            "--topics" => {
                a.topics = value()?
                    .split(',')
                    .filter(|t| !t.is_empty())
                    .map(str::to_string)
                    .collect()
            }
            "--create-topics" => a.create_topics = true,
            "--prepare-only" => a.prepare_only = true,
            "--count" => {
                let v = value()?;
                a.count = Some(
                    v.parse()
                        .map_err(|_| format!("--count {v}: not a number"))?,
                );
            }
            "--timeout" => {
                let v = value()?;
                let secs: u64 = v
                    .parse()
                    .map_err(|_| format!("--timeout {v}: not seconds"))?;
                a.timeout = Duration::from_secs(secs);
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if a.brokers.is_empty() || a.topics.is_empty() {
        return Err("--brokers and --topics are required".into());
    }
    Ok(a)
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("ferry-demo-consumer: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferry-demo-consumer: {e}");
            ExitCode::from(1)
        }
    }
}

fn run(args: &Args) -> Result<(), String> {
    let start = Instant::now();
    let left = || args.timeout.saturating_sub(start.elapsed());
    wait_for_broker(&args.brokers, left())?;
    if args.create_topics {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("runtime: {e}"))?;
        for topic in &args.topics {
            // Panics (with the broker's answer) if the broker refuses; that ends the demo loudly.
            rt.block_on(kafka::create_topic(&args.brokers, topic, DEMO_PARTITIONS));
        }
        eprintln!(
            "ferry-demo-consumer: topics ready on {}: {}",
            args.brokers,
            args.topics.join(", ")
        );
    }
    if args.prepare_only {
        return Ok(());
    }
    consume(args, start)
}

fn wait_for_broker(brokers: &str, deadline: Duration) -> Result<(), String> {
    let start = Instant::now();
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("log_level", "0")
        .create()
        .map_err(|e| format!("Kafka client for {brokers}: {e}"))?;
    loop {
        match consumer.fetch_metadata(None, Duration::from_millis(500)) {
            Ok(_) => return Ok(()),
            Err(e) if start.elapsed() >= deadline => {
                return Err(format!(
                    "the broker at {brokers} did not answer within {deadline:?}: {e}"
                ))
            }
            // fetch_metadata itself waits up to 500 ms: this loop does not spin.
            Err(_) => {}
        }
    }
}

fn consume(args: &Args, start: Instant) -> Result<(), String> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &args.brokers)
        .set("group.id", kafka_group())
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .create()
        .map_err(|e| format!("consumer: {e}"))?;
    let mut tpl = TopicPartitionList::new();
    for topic in &args.topics {
        let parts = kafka::partition_count(&args.brokers, topic).ok_or_else(|| {
            format!(
                "topic {topic} does not exist on {} (use --create-topics)",
                args.brokers
            )
        })?;
        for p in 0..parts {
            tpl.add_partition_offset(topic, p, rdkafka::Offset::Beginning)
                .map_err(|e| format!("assign {topic}/{p}: {e}"))?;
        }
    }
    consumer.assign(&tpl).map_err(|e| format!("assign: {e}"))?;
    let mut seen = 0usize;
    loop {
        if args.count.is_some_and(|n| seen >= n) {
            eprintln!("ferry-demo-consumer: {seen} records read");
            return Ok(());
        }
        if args.count.is_some() && start.elapsed() >= args.timeout {
            return Err(format!(
                "timed out after {:?}: {seen} of {} records arrived",
                args.timeout,
                args.count.unwrap_or(0)
            ));
        }
        match consumer.poll(Duration::from_millis(200)) {
            None => {}
            Some(Err(e)) => return Err(format!("consume: {e}")),
            Some(Ok(m)) => {
                seen += 1;
                let text = |b: Option<&[u8]>| {
                    b.map(|b| String::from_utf8_lossy(b).into_owned())
                        .unwrap_or_else(|| "null".into())
                };
                let header = |name: &str| {
                    m.headers()
                        .and_then(|h| h.iter().find(|h| h.key == name))
                        .map(|h| text(h.value))
                        .unwrap_or_else(|| "-".into())
                };
                println!(
                    "{} {}@{} key={} type={} id={} {}",
                    m.topic(),
                    m.partition(),
                    m.offset(),
                    text(m.key()),
                    header("type"),
                    header("id"),
                    text(m.payload())
                );
            }
        }
    }
}

/// A group id of its own (offsets are never committed; assignment is manual).
fn kafka_group() -> String {
    format!("ferry-demo-consumer-{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Result<Args, String> {
        parse_args(s.split_whitespace().map(str::to_string))
    }

    #[test]
    fn arguments_parse_and_bad_ones_are_named() {
        let a = args("--brokers b:1 --topics x,y --count 30 --timeout 9 --create-topics").unwrap();
        assert_eq!(a.topics, ["x", "y"]);
        assert_eq!(a.count, Some(30));
        assert_eq!(a.timeout, Duration::from_secs(9));
        assert!(a.create_topics && !a.prepare_only);
        assert!(args("--brokers b:1").unwrap_err().contains("--topics"));
        assert!(args("--brokers b:1 --topics x --count many")
            .unwrap_err()
            .contains("many"));
        assert!(args("--brokers b:1 --topics x --bogus")
            .unwrap_err()
            .contains("--bogus"));
    }
}
