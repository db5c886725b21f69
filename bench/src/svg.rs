//! The plot: a grouped bar chart of rows/s per workload and contender, written by hand as SVG
//! (log scale: the contenders differ by orders of magnitude, and every bar carries its value).

use std::fmt::Write as _;

use crate::report::Report;
use crate::workload::{size, Workload};
use crate::Contender;

const W: f64 = 980.0;
const H: f64 = 520.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 70.0;
const BOTTOM: f64 = 80.0;

fn colour(c: Contender) -> &'static str {
    match c {
        Contender::Recv => "#4e79a7",
        Contender::Raw => "#f28e2b",
        Contender::Ferry => "#59a14f",
        Contender::FerryCold => "#8cd17d",
        Contender::Relay => "#e15759",
        Contender::Debezium => "#b07aa1",
    }
}

/// 1234 → "1.2k", 123456 → "123k", 1234567 → "1.23M".
pub fn compact(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e5 {
        format!("{:.0}k", v / 1e3)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A round count: 20000 → "20k", 1000000 → "1M", 250 → "250".
pub fn round(v: u64) -> String {
    match v {
        v if v >= 1_000_000 && v % 100_000 == 0 => format!("{}M", v as f64 / 1e6),
        v if v >= 1_000 && v % 100 == 0 => format!("{}k", v as f64 / 1e3),
        v => v.to_string(),
    }
}

/// Two short lines under a group: rows and transactions, payload.
fn shape(w: &Workload) -> (String, String) {
    let txn = if w.txn_rows >= w.rows {
        "one txn".to_string()
    } else {
        format!("{}/txn", w.txn_rows)
    };
    (
        format!("{} rows, {txn}", round(w.rows)),
        format!("{} {}", size(w.payload), w.kind.sql_type()),
    )
}

/// The chart for `report`'s throughput results.
pub fn chart(report: &Report) -> String {
    let groups: Vec<(&Workload, Vec<(Contender, f64)>)> = report
        .workloads
        .iter()
        .map(|w| {
            let bars = Contender::ALL
                .into_iter()
                .filter_map(|c| Some((c, w.stats(c)?.rate)))
                .collect();
            (&w.workload, bars)
        })
        .collect();
    let values: Vec<f64> = groups
        .iter()
        .flat_map(|(_, b)| b.iter().map(|x| x.1))
        .filter(|v| v.is_finite() && *v > 0.0)
        .collect();
    let lo = values
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min)
        .log10()
        .floor()
        .min(3.0);
    let hi = values
        .iter()
        .copied()
        .fold(1.0, f64::max)
        .log10()
        .ceil()
        .max(lo + 1.0);
    let plot_h = H - TOP - BOTTOM;
    let y = |v: f64| TOP + plot_h * (1.0 - (v.max(10f64.powf(lo)).log10() - lo) / (hi - lo));

    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(o, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        o,
        r#"<text x="{}" y="22" font-size="15" text-anchor="middle">Rows per second draining a backlog (median of {}; {})</text>"#,
        W / 2.0,
        if report.runs == 1 {
            "1 run".to_string()
        } else {
            format!("{} runs", report.runs)
        },
        esc(&report.machine.date)
    );
    // Legend.
    let mut lx = LEFT;
    for c in Contender::ALL {
        let _ = writeln!(
            o,
            r#"<rect x="{lx}" y="36" width="12" height="12" fill="{}"/><text x="{}" y="46">{}</text>"#,
            colour(c),
            lx + 16.0,
            esc(c.label())
        );
        lx += 22.0 + 6.2 * c.label().len() as f64;
    }
    // Y axis: decades with grid lines.
    for d in (lo as i32)..=(hi as i32) {
        let v = 10f64.powi(d);
        let yy = y(v);
        let _ = writeln!(
            o,
            r##"<line x1="{LEFT}" x2="{}" y1="{yy:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            W - RIGHT,
            LEFT - 6.0,
            yy + 4.0,
            round(v as u64)
        );
    }
    let _ = writeln!(
        o,
        r#"<text transform="translate(18 {}) rotate(-90)" text-anchor="middle">rows/s (log scale)</text>"#,
        TOP + plot_h / 2.0
    );
    let _ = writeln!(
        o,
        r#"<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{}" stroke="black"/><line x1="{LEFT}" x2="{}" y1="{}" y2="{}" stroke="black"/>"#,
        TOP + plot_h,
        W - RIGHT,
        TOP + plot_h,
        TOP + plot_h
    );
    // Bars.
    let group_w = (W - LEFT - RIGHT) / groups.len().max(1) as f64;
    for (i, (w, bars)) in groups.iter().enumerate() {
        let gx = LEFT + group_w * i as f64;
        let bar_w = (group_w * 0.8 / Contender::ALL.len() as f64).min(40.0);
        let start = gx + (group_w - bar_w * bars.len() as f64) / 2.0;
        for (j, (c, v)) in bars.iter().enumerate() {
            let x = start + bar_w * j as f64;
            let top = y(*v);
            let _ = writeln!(
                o,
                r#"<rect x="{x:.1}" y="{top:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}: {v:.0} rows/s</title></rect>"#,
                bar_w - 2.0,
                TOP + plot_h - top,
                colour(*c),
                esc(c.label())
            );
            let _ = writeln!(
                o,
                r#"<text x="{:.1}" y="{:.1}" font-size="9.5" text-anchor="middle">{}</text>"#,
                x + bar_w / 2.0 - 1.0,
                top - 3.0,
                compact(*v)
            );
        }
        let cx = gx + group_w / 2.0;
        let (rows, payload) = shape(w);
        let _ = writeln!(
            o,
            r#"<text x="{cx:.1}" y="{:.1}" text-anchor="middle" font-weight="bold">{}</text><text x="{cx:.1}" y="{:.1}" text-anchor="middle" font-size="9.5">{}</text><text x="{cx:.1}" y="{:.1}" text-anchor="middle" font-size="9.5">{}</text>"#,
            TOP + plot_h + 18.0,
            esc(w.name),
            TOP + plot_h + 32.0,
            esc(&rows),
            TOP + plot_h + 44.0,
            esc(&payload)
        );
    }
    let _ = writeln!(
        o,
        r##"<text x="{}" y="{}" font-size="10" text-anchor="middle" fill="#555">{}</text>"##,
        W / 2.0,
        H - 14.0,
        esc(&report.machine.summary())
    );
    o.push_str("</svg>\n");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_compact() {
        assert_eq!(compact(950.0), "950");
        assert_eq!(compact(12_345.0), "12.3k");
        assert_eq!(compact(123_456.0), "123k");
        assert_eq!(compact(1_234_567.0), "1.23M");
        assert_eq!(esc("a<b&c"), "a&lt;b&amp;c");
        assert_eq!(round(20_000), "20k");
        assert_eq!(round(1_000_000), "1M");
        assert_eq!(round(2_500), "2.5k");
        assert_eq!(round(250), "250");
    }
}
