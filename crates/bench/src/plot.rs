//! SVG plots of a run: handshake CPU per target, throughput and CPU per byte
//! against file size, CPU and memory against connections for streaming.

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::error::BenchError;
use crate::report::{Results, Summary};
use crate::targets::TargetKind;

fn color(t: TargetKind) -> RGBColor {
    match t {
        TargetKind::Tlsgate => RGBColor(0x1f, 0x77, 0xb4),
        TargetKind::TlsgateKeysInProcess => RGBColor(0x9e, 0xc9, 0xe8),
        TargetKind::Nginx => RGBColor(0x2c, 0xa0, 0x2c),
        TargetKind::Haproxy => RGBColor(0xd6, 0x27, 0x28),
        TargetKind::HaproxyRelay => RGBColor(0xf2, 0xa0, 0xa1),
    }
}

fn plot_error(path: &Path) -> impl Fn(String) -> BenchError + '_ {
    move |e| BenchError::Other(format!("plotting {}: {e}", path.display()))
}

/// Writes every plot the results allow into `dir`; returns the files.
pub fn write_all(results: &Results, dir: &Path) -> Result<Vec<PathBuf>, BenchError> {
    let mut out = Vec::new();
    if !results.cases("handshake").is_empty() {
        let p = dir.join("handshake-cpu.svg");
        handshake_bars(results, &p).map_err(plot_error(&p))?;
        out.push(p);
    }
    if !results.cases("transfer").is_empty() {
        let p = dir.join("transfer-throughput.svg");
        by_case_lines(
            results,
            "transfer",
            &p,
            "Keep-alive transfer: throughput",
            "file size",
            "MB/s",
            |s| s.bytes_per_sec / 1e6,
        )
        .map_err(plot_error(&p))?;
        out.push(p);
        let p = dir.join("transfer-cpu-per-byte.svg");
        by_case_lines(
            results,
            "transfer",
            &p,
            "Keep-alive transfer: server CPU per byte (lower is better)",
            "file size",
            "ns of CPU per byte",
            |s| s.cpu_ns_per_byte,
        )
        .map_err(plot_error(&p))?;
        out.push(p);
    }
    if !results.cases("stream").is_empty() {
        let p = dir.join("stream-cpu.svg");
        by_case_lines(
            results,
            "stream",
            &p,
            "Streaming: server CPU against connections",
            "connections",
            "server CPU %",
            |s| s.server_utilization * 100.0,
        )
        .map_err(plot_error(&p))?;
        out.push(p);
        let p = dir.join("stream-memory.svg");
        by_case_lines(
            results,
            "stream",
            &p,
            "Streaming: server memory (PSS) against connections",
            "connections",
            "MB",
            |s| s.pss_bytes / 1e6,
        )
        .map_err(plot_error(&p))?;
        out.push(p);
    }
    Ok(out)
}

/// Grouped bars: CPU µs per handshake, one group per handshake kind.
fn handshake_bars(results: &Results, path: &Path) -> Result<(), String> {
    let cases = results.cases("handshake");
    let targets = results.targets_in("handshake");
    let value = |case: &str, t: TargetKind| {
        results
            .summary("handshake", case, t)
            .map_or(0.0, |s| s.cpu_us_per_op)
    };
    let max = cases
        .iter()
        .flat_map(|c| targets.iter().map(move |t| value(c, *t)))
        .fold(0.0f64, f64::max)
        .max(1.0);
    let root = SVGBackend::new(path, (1000, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let groups = cases.len() as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Server CPU per handshake (µs, lower is better)",
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(60)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..groups, 0.0..max * 1.15)
        .map_err(|e| e.to_string())?;
    let labels = cases.clone();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(cases.len() * 2 + 1)
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            if (x - x.floor() - 0.5).abs() < 0.01 && i < labels.len() {
                labels[i].clone()
            } else {
                String::new()
            }
        })
        .y_desc("µs of server CPU per handshake")
        .draw()
        .map_err(|e| e.to_string())?;
    let width = 0.8 / targets.len().max(1) as f64;
    for (ti, t) in targets.iter().enumerate() {
        let c = color(*t);
        chart
            .draw_series(cases.iter().enumerate().map(|(ci, case)| {
                let x0 = ci as f64 + 0.1 + ti as f64 * width;
                Rectangle::new(
                    [(x0, 0.0), (x0 + width * 0.95, value(case, *t))],
                    c.filled(),
                )
            }))
            .map_err(|e| e.to_string())?
            .label(t.name())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], c.filled()));
    }
    if let Some(b) = &results.bounds {
        chart
            .draw_series(cases.iter().enumerate().filter_map(|(ci, case)| {
                let v = b.handshake_us(case)?;
                Some(PathElement::new(
                    vec![(ci as f64 + 0.05, v), (ci as f64 + 0.95, v)],
                    BLACK.stroke_width(2),
                ))
            }))
            .map_err(|e| e.to_string())?
            .label("bound (crypto + TCP)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 10, y)], BLACK.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

/// One line per target over the cases of a scenario (in order).
fn by_case_lines(
    results: &Results,
    scenario: &str,
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    f: fn(&Summary) -> f64,
) -> Result<(), String> {
    let cases = results.cases(scenario);
    let targets = results.targets_in(scenario);
    let max = results
        .summaries
        .iter()
        .filter(|s| s.scenario == scenario)
        .map(f)
        .fold(0.0f64, f64::max)
        .max(1e-9);
    let root = SVGBackend::new(path, (1000, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let n = cases.len().max(1);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.3..(n as f64 - 0.7), 0.0..max * 1.15)
        .map_err(|e| e.to_string())?;
    let labels = cases.clone();
    chart
        .configure_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 0.01 && i >= 0.0 && (i as usize) < labels.len() {
                labels[i as usize].clone()
            } else {
                String::new()
            }
        })
        .x_desc(x_desc)
        .y_desc(y_desc)
        .draw()
        .map_err(|e| e.to_string())?;
    for t in targets {
        let c = color(t);
        let points: Vec<(f64, f64)> = cases
            .iter()
            .enumerate()
            .filter_map(|(i, case)| Some((i as f64, f(results.summary(scenario, case, t)?))))
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), c.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(t.name())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 12, y)], c.stroke_width(2)));
        chart
            .draw_series(points.into_iter().map(|p| Circle::new(p, 3, c.filled())))
            .map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}
