//! Server CPU time and memory from /proc, over a whole process tree (nginx
//! master and worker, HAProxy, tlsgate and its threads).

use std::fs;

/// The processes of one target.
#[derive(Debug, Clone)]
pub struct ProcessTree {
    pids: Vec<u32>,
}

/// One sample of a tree.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sample {
    /// CPU time of every thread, nanoseconds (scheduler accounting).
    pub cpu_ns: u64,
    /// Proportional set size summed over the processes, bytes (shared pages
    /// counted once across the tree, unlike RSS).
    pub pss_bytes: u64,
}

impl ProcessTree {
    /// `root` and all its descendants, as they are now.
    pub fn of(root: u32) -> Self {
        let mut pids = vec![root];
        let parents: Vec<(u32, u32)> = fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter_map(|pid| Some((pid, parent_of(pid)?)))
            .collect();
        let mut i = 0;
        while i < pids.len() {
            let p = pids[i];
            pids.extend(parents.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
            i += 1;
        }
        Self { pids }
    }

    /// The processes.
    pub fn pids(&self) -> &[u32] {
        &self.pids
    }

    /// CPU and memory now.
    pub fn sample(&self) -> Sample {
        let mut s = Sample::default();
        for pid in &self.pids {
            s.cpu_ns += process_cpu_ns(*pid);
            s.pss_bytes += pss_bytes(*pid);
        }
        s
    }

    /// CPU only (cheaper: no smaps walk).
    pub fn cpu_ns(&self) -> u64 {
        self.pids.iter().map(|p| process_cpu_ns(*p)).sum()
    }
}

fn parent_of(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields follow the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Sum over the process's threads of their schedstat run time. Falls back
/// to utime+stime ticks when schedstat is unavailable.
fn process_cpu_ns(pid: u32) -> u64 {
    let mut total = 0u64;
    let mut any = false;
    if let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            let path = t.path().join("schedstat");
            if let Some(ns) = fs::read_to_string(path)
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            {
                total += ns;
                any = true;
            }
        }
    }
    if any {
        return total;
    }
    ticks_ns(pid).unwrap_or(0)
}

fn ticks_ns(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat; 11 and 12 after the name.
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // USER_HZ is 100 on Linux/x86-64.
    Some(ticks * 10_000_000)
}

/// Time one core has spent, from /proc/stat, in USER_HZ ticks: how busy a
/// load generator's core was while a tool ran on it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CoreTicks {
    /// Not idle (user, nice, system, irq, softirq, steal).
    pub busy: u64,
    /// Busy and idle (idle, iowait).
    pub total: u64,
}

impl CoreTicks {
    /// The core's ticks so far, or `None` for a core /proc/stat does not list.
    pub fn now(core: usize) -> Option<Self> {
        Self::parse(&fs::read_to_string("/proc/stat").ok()?, core)
    }

    fn parse(stat: &str, core: usize) -> Option<Self> {
        let name = format!("cpu{core}");
        let line = stat
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name.as_str()))?;
        let f: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .take(8)
            .map(|v| v.parse().ok())
            .collect::<Option<_>>()?;
        // user nice system idle iowait irq softirq steal (guest time is
        // already inside user).
        let idle = *f.get(3)? + *f.get(4)?;
        let total: u64 = f.iter().sum();
        Some(Self {
            busy: total - idle,
            total,
        })
    }

    /// The busy share of the time between `earlier` and `self`.
    pub fn busy_since(&self, earlier: &Self) -> f64 {
        let total = self.total.saturating_sub(earlier.total);
        self.busy.saturating_sub(earlier.busy) as f64 / total.max(1) as f64
    }
}

fn pss_bytes(pid: u32) -> u64 {
    let Ok(text) = fs::read_to_string(format!("/proc/{pid}/smaps_rollup")) else {
        return 0;
    };
    text.lines()
        .find(|l| l.starts_with("Pss:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cores_ticks_are_read_from_its_own_line() {
        let stat = "cpu  10 0 10 80 0 0 0 0 0 0\n\
                    cpu0 5 0 5 40 0 0 0 0 0 0\n\
                    cpu1 1 2 3 4 5 6 7 8 9 10\n\
                    intr 1 2 3\n";
        assert_eq!(
            CoreTicks::parse(stat, 1),
            Some(CoreTicks {
                busy: 1 + 2 + 3 + 6 + 7 + 8,
                total: 36
            })
        );
        assert_eq!(CoreTicks::parse(stat, 2), None);
        let a = CoreTicks {
            busy: 10,
            total: 100,
        };
        let b = CoreTicks {
            busy: 40,
            total: 140,
        };
        assert!((b.busy_since(&a) - 0.75).abs() < 1e-12);
    }

    #[test]
    fn a_busy_child_is_found_and_its_cpu_counted() {
        let mut child = std::process::Command::new("sh")
            .args([
                "-c",
                "sh -c 'i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; sleep 5' & wait",
            ])
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(300));
        let tree = ProcessTree::of(child.id());
        assert!(tree.pids().len() >= 2, "{:?}", tree.pids());
        let s = tree.sample();
        assert!(s.cpu_ns > 10_000_000, "{s:?}");
        assert!(s.pss_bytes > 0);
        let _ = child.kill();
        let _ = child.wait();
    }
}
