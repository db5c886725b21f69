//! The topic half of routing: `route.rules` and the `route.topic` template compiled into a plan,
//! and the topic cache.
//!
//! The topic is a pure function of the values of the plan's *input columns* (those the template
//! and the rules name), so each combination is rendered, checked against Kafka's rules and interned
//! as an `Arc<str>` once, then served from a hash map: no rendering, no regex and no allocation for
//! a repeated topic. Only successes are cached. The cache is bounded ([`TOPIC_CACHE_CAPACITY`]) and
//! cleared when full, so a template over a high-cardinality column costs a render per row, never
//! unbounded memory.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;

use crate::base::error::{shown_topic, FieldRole, RouteErrorReason};
use crate::base::read::{column, column_for, value};
use crate::base::row::{OutboxRow, Slot};
use crate::base::template::{slot_of, GroupRef, Segment, Template};
use crate::base::topic::validate_topic;
use crate::compile::config::{OutboxConfig, RouteConfig};
use crate::compile::validate::{compile_rule_regex, problem, ConfigErrors};

/// Most distinct topic-input combinations kept in the topic cache before it is cleared.
pub const TOPIC_CACHE_CAPACITY: usize = 4096;

#[derive(Debug)]
enum Matcher {
    Equals(Box<[u8]>),
    Regex(regex::bytes::Regex),
}

#[derive(Debug)]
enum Target {
    Fixed(Arc<str>),
    Template(Template),
}

#[derive(Debug)]
struct Rule {
    slot: usize,
    matcher: Matcher,
    target: Target,
}

#[derive(Debug)]
pub(crate) struct TopicPlan {
    /// Columns the topic depends on; template slots index this list.
    inputs: Vec<String>,
    rules: Vec<Rule>,
    default: Target,
    cache: Mutex<Cache>,
}

/// Topics by their inputs' key, and the last one found: rows of one topic come in runs, and
/// comparing with the last key costs less than hashing it.
#[derive(Debug, Default)]
struct Cache {
    /// The last key (its buffer reused, so alternating topics allocate nothing) and its topic.
    last: (Vec<u8>, Option<Arc<str>>),
    map: HashMap<Box<[u8]>, Arc<str>>,
}

impl Cache {
    fn set_last(&mut self, key: &[u8], topic: &Arc<str>) {
        self.last.0.clear();
        self.last.0.extend_from_slice(key);
        self.last.1 = Some(topic.clone());
    }
}

fn target(
    text: &str,
    path: &str,
    groups: bool,
    inputs: &mut Vec<String>,
) -> Result<Target, ConfigErrors> {
    let mut t = Template::parse(text, groups).map_err(|e| problem(path, e))?;
    if let Some(fixed) = t.as_fixed() {
        return Ok(Target::Fixed(Arc::from(fixed)));
    }
    t.bind(inputs);
    Ok(Target::Template(t))
}

impl TopicPlan {
    /// Compiles `route.rules` and the topic template (the configuration is already validated).
    /// The columns the topic depends on.
    pub(crate) fn inputs(&self) -> &[String] {
        &self.inputs
    }

    pub(crate) fn compile(
        outbox: &OutboxConfig,
        route: &RouteConfig,
    ) -> Result<TopicPlan, ConfigErrors> {
        let mut inputs = Vec::new();
        let mut rules = Vec::new();
        for (i, r) in route.rules.iter().enumerate() {
            let slot = slot_of(&mut inputs, &r.column);
            let matcher = match (&r.equals, &r.regex) {
                (Some(e), _) => Matcher::Equals(e.as_bytes().into()),
                (None, Some(re)) => Matcher::Regex(
                    compile_rule_regex(re)
                        .map_err(|e| problem(&format!("route.rules[{i}].regex"), e))?,
                ),
                (None, None) => {
                    return Err(problem(&format!("route.rules[{i}]"), "no matcher".into()))
                }
            };
            let path = format!("route.rules[{i}].topic");
            let target = target(&r.topic, &path, r.regex.is_some(), &mut inputs)?;
            rules.push(Rule {
                slot,
                matcher,
                target,
            });
        }
        let default = target(
            &route.topic_template(outbox),
            "route.topic",
            false,
            &mut inputs,
        )?;
        Ok(TopicPlan {
            inputs,
            rules,
            default,
            cache: Mutex::default(),
        })
    }

    fn input<R: OutboxRow + ?Sized>(
        &self,
        row: &R,
        slot: usize,
    ) -> Result<Option<Bytes>, RouteErrorReason> {
        let name = &self.inputs[slot];
        let c = if self.inputs.len() == 1 {
            column_for(row, Slot::TopicInput, name, FieldRole::Topic)?
        } else {
            column(row, name, FieldRole::Topic)?
        };
        value(&c, name, FieldRole::Topic)
    }

    pub(crate) fn topic<R: OutboxRow + ?Sized>(
        &self,
        row: &R,
    ) -> Result<Arc<str>, RouteErrorReason> {
        let plan = self;
        match plan.inputs.len() {
            0 => plan.resolve(&[]),
            1 => {
                let v = self.input(row, 0)?;
                let Some(k) = &v else {
                    return plan.resolve(std::slice::from_ref(&v));
                };
                if let Some(t) = plan.cached(k) {
                    return Ok(t);
                }
                let t = plan.resolve(std::slice::from_ref(&v))?;
                plan.remember(k, &t);
                Ok(t)
            }
            n => {
                let mut values = Vec::with_capacity(n);
                let mut key = Vec::new();
                for slot in 0..n {
                    let v = self.input(row, slot)?;
                    match &v {
                        None => key.push(0),
                        Some(b) => {
                            key.push(1);
                            key.extend_from_slice(&(b.len() as u64).to_le_bytes());
                            key.extend_from_slice(b);
                        }
                    }
                    values.push(v);
                }
                if let Some(t) = plan.cached(&key) {
                    return Ok(t);
                }
                let t = plan.resolve(&values)?;
                plan.remember(&key, &t);
                Ok(t)
            }
        }
    }

    fn cached(&self, key: &[u8]) -> Option<Arc<str>> {
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        if let (k, Some(topic)) = &cache.last {
            if k[..] == *key {
                return Some(topic.clone());
            }
        }
        let topic = cache.map.get(key)?.clone();
        cache.set_last(key, &topic);
        Some(topic)
    }

    fn remember(&self, key: &[u8], topic: &Arc<str>) {
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        if cache.map.len() >= TOPIC_CACHE_CAPACITY {
            cache.map.clear();
        }
        cache.map.insert(key.into(), topic.clone());
        cache.set_last(key, topic);
    }

    /// The topic for these input values (aligned with `inputs`): first matching rule, else default.
    fn resolve(&self, values: &[Option<Bytes>]) -> Result<Arc<str>, RouteErrorReason> {
        for rule in &self.rules {
            let Some(v) = &values[rule.slot] else {
                continue;
            };
            match &rule.matcher {
                Matcher::Equals(e) if v[..] == e[..] => {
                    return self.render(&rule.target, values, None)
                }
                Matcher::Equals(_) => {}
                Matcher::Regex(re) => {
                    if let Some(caps) = re.captures(v) {
                        return self.render(&rule.target, values, Some(&caps));
                    }
                }
            }
        }
        self.render(&self.default, values, None)
    }

    fn render(
        &self,
        target: &Target,
        values: &[Option<Bytes>],
        caps: Option<&regex::bytes::Captures<'_>>,
    ) -> Result<Arc<str>, RouteErrorReason> {
        let t = match target {
            Target::Fixed(t) => return Ok(t.clone()),
            Target::Template(t) => t,
        };
        let mut buf = Vec::with_capacity(64);
        for seg in t.segments() {
            match seg {
                Segment::Literal(l) => buf.extend_from_slice(l.as_bytes()),
                Segment::Column { name, slot } => match &values[*slot] {
                    Some(v) => buf.extend_from_slice(v),
                    None => {
                        return Err(RouteErrorReason::NullValue {
                            role: FieldRole::Topic,
                            column: name.clone(),
                        })
                    }
                },
                Segment::Group(g) => {
                    let m = caps.and_then(|c| match g {
                        GroupRef::Index(i) => c.get(*i),
                        GroupRef::Name(n) => c.name(n),
                    });
                    if let Some(m) = m {
                        buf.extend_from_slice(m.as_bytes());
                    }
                }
            }
        }
        validate_topic(&buf).map_err(|problem| RouteErrorReason::InvalidTopic {
            topic: shown_topic(&buf),
            problem,
        })?;
        // validate_topic admits only ASCII, so this cannot fail.
        let s = String::from_utf8(buf).map_err(|e| RouteErrorReason::InvalidTopic {
            topic: shown_topic(e.as_bytes()),
            problem: crate::base::topic::TopicProblem::Empty,
        })?;
        Ok(Arc::from(s))
    }
}
