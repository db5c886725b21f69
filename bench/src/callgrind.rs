//! A reader of callgrind's output files (`callgrind.out.*`): self cost per function.
//!
//! The format (valgrind's "Callgrind Format Specification"): header lines (`events: Ir`,
//! `positions: line`, ...), then position lines naming the object (`ob=`), the function's file
//! (`fl=`), the file of inlined code (`fi=`/`fe=`) and the function (`fn=`), each name either
//! `(id) name` (defining the id) or `(id)` (using it), with one id space per kind (`cob=` shares
//! the object's, `cfi=`/`cfl=` the file's, `cfn=` the function's). Cost lines are positions
//! (absolute, `+n`, `-n` or `*`) followed by one count per event; a count missing at the end is
//! zero. A `calls=<count> <target>` line is followed by one cost line: the *inclusive* cost of
//! those calls, charged to the callee's self cost elsewhere in the file; it is skipped here, so
//! that only self cost is summed.

use std::collections::HashMap;

/// One function: the object it was loaded from, its file and its name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Func {
    pub object: String,
    pub file: String,
    pub name: String,
}

/// Calls from one function to another (by name): how many, and their inclusive cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Calls {
    pub count: u64,
    pub inclusive: u64,
}

/// A parsed file: self `Ir` per function, the calls between functions (by name), and the
/// total the file states (`totals:` or `summary:`), if any.
#[derive(Debug, Clone, Default)]
pub struct Profile {
    pub functions: HashMap<Func, u64>,
    /// (caller, callee) → calls.
    pub calls: HashMap<(String, String), Calls>,
    pub stated_total: Option<u64>,
}

impl Profile {
    /// The sum of every function's self cost.
    pub fn total(&self) -> u64 {
        self.functions.values().sum()
    }
}

/// Id → name tables of one kind.
#[derive(Default)]
struct Names(HashMap<u64, String>);

impl Names {
    /// `(id) name`, `(id)` or `name`.
    fn resolve(&mut self, v: &str) -> Result<String, String> {
        let v = v.trim();
        let Some(rest) = v.strip_prefix('(') else {
            return Ok(v.to_string());
        };
        let (id, name) = rest
            .split_once(')')
            .ok_or_else(|| format!("unclosed name id in {v:?}"))?;
        let id: u64 = id.trim().parse().map_err(|_| format!("bad id in {v:?}"))?;
        let name = name.trim();
        if name.is_empty() {
            self.0
                .get(&id)
                .cloned()
                .ok_or_else(|| format!("name id ({id}) used before it was defined"))
        } else {
            self.0.insert(id, name.to_string());
            Ok(name.to_string())
        }
    }
}

/// Parses one callgrind output file's bytes. Only the first event (`Ir` by default) is read.
pub fn parse(bytes: &[u8]) -> Result<Profile, String> {
    let text = String::from_utf8_lossy(bytes);
    let (mut objects, mut files, mut fns) = (Names::default(), Names::default(), Names::default());
    let mut positions = 1usize;
    let mut ir_column: Option<usize> = Some(0);
    let (mut ob, mut fl, mut func) = (String::new(), String::new(), None::<Func>);
    // After `calls=`: the count, waiting for the line of their inclusive cost.
    let mut pending_calls: Option<u64> = None;
    let mut callee = String::new();
    let mut out = Profile::default();
    for (n, line) in text.lines().enumerate() {
        let err = |e: String| format!("line {}: {e}", n + 1);
        let line = line.trim_end();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let first = line.as_bytes()[0];
        if first.is_ascii_digit() || first == b'+' || first == b'-' || first == b'*' {
            let mut fields = line.split_ascii_whitespace().skip(positions);
            let ir = match ir_column {
                Some(i) => match fields.nth(i) {
                    Some(v) => v.parse::<u64>().map_err(|_| err(format!("cost {v:?}")))?,
                    None => 0,
                },
                None => 0,
            };
            let f = func
                .as_ref()
                .ok_or_else(|| err("a cost before any fn=".into()))?;
            if let Some(count) = pending_calls.take() {
                // The inclusive cost of the calls: not the caller's self cost.
                let c = out
                    .calls
                    .entry((f.name.clone(), callee.clone()))
                    .or_default();
                c.count += count;
                c.inclusive += ir;
            } else if ir > 0 {
                *out.functions.entry(f.clone()).or_default() += ir;
            }
            continue;
        }
        let Some((key, value)) = line.split_once(['=', ':']) else {
            continue;
        };
        match key {
            "ob" => ob = objects.resolve(value).map_err(err)?,
            "cob" => {
                objects.resolve(value).map_err(err)?;
            }
            "fl" => fl = files.resolve(value).map_err(err)?,
            "fi" | "fe" | "cfi" | "cfl" => {
                files.resolve(value).map_err(err)?;
            }
            "fn" => {
                func = Some(Func {
                    object: ob.clone(),
                    file: fl.clone(),
                    name: fns.resolve(value).map_err(err)?,
                })
            }
            "cfn" => callee = fns.resolve(value).map_err(err)?,
            "calls" => {
                let v = value.split_ascii_whitespace().next().unwrap_or("0");
                pending_calls = Some(v.parse().map_err(|_| err(format!("calls {v:?}")))?);
            }
            "positions" => positions = value.split_ascii_whitespace().count().max(1),
            "events" => {
                ir_column = value
                    .split_ascii_whitespace()
                    .position(|e| e == "Ir")
                    .or(Some(0));
            }
            "totals" | "summary" => {
                let v = value.split_ascii_whitespace().next().unwrap_or("0");
                let t = v.parse::<u64>().map_err(|_| err(format!("total {v:?}")))?;
                // `totals:` (at the end) wins over `summary:` (in the header).
                if key == "totals" || out.stated_total.is_none() {
                    out.stated_total = Some(t);
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small file in callgrind's compressed format: two objects, name ids defined in `cfn=`
    /// and used by `fn=`, relative positions, an inlined file, calls with their inclusive cost.
    const FIXTURE: &[u8] = b"# callgrind format
version: 1
creator: callgrind-3.22.0
pid: 42
cmd:  ./ferry run
part: 1

desc: I1 cache: 
positions: line
events: Ir
summary: 1175

ob=(1) /work/target/release/ferry
fl=(1) /work/crates/ferry-wal/src/pgoutput.rs
fn=(1) ferry_wal::pgoutput::decode
12 100
+1 50
fi=(2) /rustc/library/core/src/slice/mod.rs
-3 7
fe=(1)
* 3
cob=(2) /usr/lib/x86_64-linux-gnu/libc.so.6
cfi=(3) ./malloc/malloc.c
cfn=(2) malloc
calls=2 0x1234
14 900
+2 5

ob=(2)
fl=(3)
fn=(2)
0 1000
fn=(3) free
0 10
ob=(1)
fl=(1)
fn=(1)
20 0

totals: 1175
";

    #[test]
    fn self_cost_per_function_without_the_inclusive_cost_of_calls() {
        let p = parse(FIXTURE).unwrap();
        let ferry = "/work/target/release/ferry";
        let libc = "/usr/lib/x86_64-linux-gnu/libc.so.6";
        let get = |o: &str, f: &str, n: &str| {
            p.functions
                .get(&Func {
                    object: o.into(),
                    file: f.into(),
                    name: n.into(),
                })
                .copied()
        };
        // 100 + 50 + 7 (inlined) + 3 + 5; the 900 after calls= is malloc's inclusive cost.
        assert_eq!(
            get(
                ferry,
                "/work/crates/ferry-wal/src/pgoutput.rs",
                "ferry_wal::pgoutput::decode"
            ),
            Some(165)
        );
        assert_eq!(get(libc, "./malloc/malloc.c", "malloc"), Some(1000));
        assert_eq!(get(libc, "./malloc/malloc.c", "free"), Some(10));
        assert_eq!(p.functions.len(), 3);
        let to_malloc = p.calls[&("ferry_wal::pgoutput::decode".into(), "malloc".into())];
        assert_eq!(
            to_malloc,
            Calls {
                count: 2,
                inclusive: 900
            }
        );
        assert_eq!(p.total(), 1175);
        assert_eq!(p.stated_total, Some(1175));
    }

    #[test]
    fn several_events_and_positions() {
        let f = b"positions: instr line\nevents: Dr Ir\nfn=(1) f\n0x10 3 1 2\n+4 * 5\n+4 * 6 7\n";
        let p = parse(f).unwrap();
        assert_eq!(p.total(), 2 + 7);
    }

    #[test]
    fn an_undefined_id_is_an_error() {
        assert!(parse(b"fn=(7)\n1 1\n").is_err());
        assert!(parse(b"1 1\n").is_err());
    }
}
