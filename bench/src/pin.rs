//! `--pinned`: PostgreSQL on CPU 0, everything else (this process, the broker, Ferry and the
//! other contenders, which inherit the affinity of the thread that starts them) on CPU 1, so the
//! figures model a deployment where the relay does not share the database's cores.
//!
//! Affinity is per thread on Linux and inherited across `fork`: this process's threads are
//! pinned once (`/proc/self/task`), and the postmaster with every process it forked so far, so
//! the backends and walsenders it forks later land on its CPU too.

use std::io;

/// The CPU PostgreSQL runs on, and the one for everything else.
pub const PG_CPU: usize = 0;
pub const CLIENT_CPU: usize = 1;

#[allow(unsafe_code)]
fn set_affinity(tid: i32, cpu: usize) -> io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET and sched_setaffinity only read
    // and write it within its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Pins the calling thread to `cpu`.
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    set_affinity(0, cpu)
}

/// Pins every thread of this process to `cpu`.
pub fn pin_self(cpu: usize) -> io::Result<()> {
    for entry in std::fs::read_dir("/proc/self/task")? {
        if let Some(tid) = entry?.file_name().to_str().and_then(|s| s.parse().ok()) {
            set_affinity(tid, cpu)?;
        }
    }
    Ok(())
}

/// The parent pid from `/proc/<pid>/stat` (after the parenthesised command, which may hold
/// spaces).
pub fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split(' ').nth(1)?.parse().ok()
}

/// Pins `root` and all its descendants (every thread of each) to `cpu`; returns how many
/// processes.
pub fn pin_tree(root: i32, cpu: usize) -> io::Result<usize> {
    let mut procs: Vec<(i32, i32)> = Vec::new();
    for entry in std::fs::read_dir("/proc")? {
        let Some(pid) = entry?
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if let Some(ppid) = parent_of(pid) {
            procs.push((pid, ppid));
        }
    }
    let mut tree = vec![root];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        tree.extend(procs.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    for pid in &tree {
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
            for t in tasks.flatten() {
                if let Some(tid) = t.file_name().to_str().and_then(|s| s.parse().ok()) {
                    // A process that exited meanwhile is no concern.
                    let _ = set_affinity(tid, cpu);
                }
            }
        }
    }
    Ok(tree.len())
}

/// The CPUs this process may run on.
pub fn cpus_available() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parent_of_this_process_is_read_from_proc() {
        let me = std::process::id() as i32;
        let parent = parent_of(me).expect("a parent");
        assert_eq!(parent, std::os::unix::process::parent_id() as i32);
    }
}
