//! Bar charts of a [`Report`], as SVG.
//!
//! Where it sits: `main` calls [`draw`] after writing `results.md`; it reads
//! the cells' medians (the same figures as the tables, through the helpers in
//! [`crate::report`]) and writes `w1-throughput`, `w1-latency`,
//! `w2-throughput` and `w2-handoff` as `.svg` (a browser, GitHub and any
//! converter show them; the PNG copies the bench once drew cost its every
//! build a bitmap and image stack). A chart with no data is skipped. Text is
//! laid out with the metrics of the embedded DejaVu Sans (see
//! `assets/DejaVuSans-LICENSE.txt`), so no system font or fontconfig is needed.

use std::{
    path::{Path, PathBuf},
    sync::OnceLock,
};

use anyhow::{anyhow, Context};
use plotters::{
    coord::Shift,
    prelude::*,
    style::text_anchor::{HPos, Pos, VPos},
};

use crate::{
    model::Report,
    report::{cell, engine_ids, w1_clients},
};

const FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");
const SIZE: (u32, u32) = (1000, 600);
const PALETTE: [RGBColor; 5] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
];
const GREY: RGBColor = RGBColor(90, 90, 90);

/// Registers the embedded font as plotters' `sans-serif` (once per process).
fn font() -> anyhow::Result<()> {
    static OK: OnceLock<bool> = OnceLock::new();
    let ok = *OK.get_or_init(|| plotters::style::register_font("sans-serif", FontStyle::Normal, FONT).is_ok());
    if ok {
        Ok(())
    } else {
        Err(anyhow!("the embedded font could not be read"))
    }
}

/// One grouped bar chart: x = engines, one bar per series in each group.
struct Bars {
    /// File name without extension.
    stem: &'static str,
    title: String,
    y_desc: String,
    groups: Vec<String>,
    /// (legend label, one value per group).
    series: Vec<(String, Vec<Option<f64>>)>,
    /// Formats a value for the label above its bar and the y axis.
    fmt: fn(f64) -> String,
}

impl Bars {
    fn values(&self) -> impl Iterator<Item = f64> + '_ {
        self.series.iter().flat_map(|(_, v)| v.iter().flatten().copied()).filter(|v| v.is_finite() && *v > 0.0)
    }

    fn has_data(&self) -> bool {
        self.values().next().is_some()
    }

    /// Log scale when the values span more than 30×.
    fn log(&self) -> bool {
        let (lo, hi) = self.values().fold((f64::INFINITY, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
        hi / lo > 30.0
    }
}

/// `123,456` → `123k`; three significant digits, whatever the magnitude.
fn compact(x: f64) -> String {
    let (v, suffix) = match x.abs() {
        a if a >= 1e6 => (x / 1e6, "M"),
        a if a >= 1e4 => (x / 1e3, "k"),
        _ => (x, ""),
    };
    let s = match v.abs() {
        a if a >= 100.0 || a == 0.0 => format!("{v:.0}"),
        a if a >= 10.0 => format!("{v:.1}"),
        a if a >= 1.0 => format!("{v:.2}"),
        a if a >= 0.01 => format!("{v:.3}"),
        _ => format!("{v:.4}"),
    };
    // 1.50 → 1.5, 10.0 → 10 (but keep integers as they are).
    let s = if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s };
    format!("{s}{suffix}")
}

/// Writes the charts of `r` into `out`; returns the files written.
pub fn draw(r: &Report, out: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let charts: Vec<Bars> = charts(r).into_iter().filter(Bars::has_data).collect();
    if charts.is_empty() {
        return Ok(Vec::new());
    }
    font()?;
    std::fs::create_dir_all(out).with_context(|| format!("create {}", out.display()))?;
    let sub = subtitle(r);
    let mut written = Vec::new();
    for b in &charts {
        let svg = out.join(format!("{}.svg", b.stem));
        render(SVGBackend::new(&svg, SIZE).into_drawing_area(), b, &sub)
            .with_context(|| format!("draw {}", svg.display()))?;
        written.push(svg);
    }
    Ok(written)
}

/// Machine, run count and mode, under every title.
fn subtitle(r: &Report) -> String {
    let m = &r.machine;
    let runs = match r.settings.runs {
        1 => "1 run".to_string(),
        n => format!("median of {n} runs"),
    };
    let mut s = format!(
        "{} cores, {} · {runs} of {} s · {}",
        m.cores,
        m.cpu.trim(),
        r.settings.seconds,
        r.started.get(..10).unwrap_or(&r.started)
    );
    if r.mode == "quick" {
        s.push_str(" · QUICK MODE: a smoke check, not results");
    }
    s
}

/// Every chart's data (some may be empty).
fn charts(r: &Report) -> Vec<Bars> {
    let mut v = Vec::new();
    let with = |w: &str| -> Vec<String> {
        engine_ids(r).into_iter().filter(|e| r.cells.iter().any(|c| c.workload == w && &c.engine == e)).collect()
    };

    let w1 = with("W1");
    let cs = w1_clients(r);
    v.push(Bars {
        stem: "w1-throughput",
        title: "W1 uncontended: acquire → release cycles/s (each client on its own lock)".into(),
        y_desc: "cycles/s".into(),
        series: cs
            .iter()
            .map(|&c| {
                (
                    format!("{c} client{}", if c == 1 { "" } else { "s" }),
                    w1.iter().map(|e| cell(r, "W1", e, Some(c)).map(|c| c.median.cycles_per_sec)).collect(),
                )
            })
            .collect(),
        groups: w1.clone(),
        fmt: compact,
    });
    if let Some(&top) = cs.last() {
        let lat = |f: fn(&crate::model::Latency) -> f64| -> Vec<Option<f64>> {
            w1.iter().map(|e| cell(r, "W1", e, Some(top)).map(|c| f(&c.median.acquire_ms))).collect()
        };
        v.push(Bars {
            stem: "w1-latency",
            title: format!("W1 uncontended: acquire latency at {top} clients"),
            y_desc: "acquire latency, ms".into(),
            series: vec![("p50".into(), lat(|l| l.p50)), ("p99".into(), lat(|l| l.p99))],
            groups: w1,
            fmt: compact,
        });
    }

    let w2 = with("W2");
    let n = r.cells.iter().find(|c| c.workload == "W2").map_or(0, |c| c.clients);
    let w2_cell = |e: &String| cell(r, "W2", e, None);
    v.push(Bars {
        stem: "w2-throughput",
        title: format!("W2 contended: cycles/s, {n} clients on one lock"),
        y_desc: "cycles/s".into(),
        series: vec![("cycles/s".into(), w2.iter().map(|e| w2_cell(e).map(|c| c.median.cycles_per_sec)).collect())],
        groups: w2.clone(),
        fmt: compact,
    });
    let hand = |f: fn(&crate::model::Latency) -> f64| -> Vec<Option<f64>> {
        w2.iter().map(|e| w2_cell(e).and_then(|c| c.median.handoff_ms).map(|h| f(&h))).collect()
    };
    v.push(Bars {
        stem: "w2-handoff",
        title: format!("W2 contended: handoff latency (release starts → next holder's grant), {n} clients"),
        y_desc: "handoff latency, ms".into(),
        series: vec![("p50".into(), hand(|l| l.p50)), ("p99".into(), hand(|l| l.p99))],
        groups: w2,
        fmt: compact,
    });
    v
}

/// Draws text (SVG keeps it whole; the viewer's font renders it).
struct Painter;

/// Where a text's anchor point is, and whether it runs upwards (a y-axis title).
#[derive(Clone, Copy)]
struct Anchor {
    h: HPos,
    v: VPos,
    up: bool,
}

const fn anchor(h: HPos, v: VPos) -> Anchor {
    Anchor { h, v, up: false }
}

impl Painter {
    fn text<DB: DrawingBackend>(
        &mut self,
        area: &DrawingArea<DB, Shift>,
        s: &str,
        (x, y): (i32, i32),
        size: f64,
        color: &RGBColor,
        a: Anchor,
    ) -> anyhow::Result<()> {
        let font = FontDesc::new(FontFamily::SansSerif, size, FontStyle::Normal);
        let trans = if a.up { FontTransform::Rotate270 } else { FontTransform::None };
        let style = font.color(color).pos(Pos::new(a.h, a.v)).transform(trans);
        area.draw(&Text::new(s.to_string(), (x, y), style)).map_err(|e| anyhow!("{e:?}"))
    }
}

/// Round steps (1, 2 or 5 × 10ⁿ) from 0 to at least `top`.
fn linear_ticks(top: f64) -> Vec<f64> {
    let raw = top / 6.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = mag * [1.0, 2.0, 5.0, 10.0].into_iter().find(|&f| f * mag >= raw).unwrap_or(10.0);
    (0..).map(|i| i as f64 * step).take_while(|&t| t <= top * (1.0 + 1e-9)).collect()
}

/// Draws `b` on `root` (any backend) and flushes it.
fn render<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, b: &Bars, sub: &str) -> anyhow::Result<()> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("{e:?}");
    let mut p = Painter;
    root.fill(&WHITE).map_err(err)?;
    let (w, _) = root.dim_in_pixel();
    let mid = w as i32 / 2;
    p.text(&root, &b.title, (mid, 10), 22.0, &BLACK, anchor(HPos::Center, VPos::Top))?;
    p.text(&root, sub, (mid, 40), 15.0, &GREY, anchor(HPos::Center, VPos::Top))?;
    let mut top = 62;
    if b.series.len() > 1 {
        legend(&mut p, &root, b, top + 12)?;
        top += 26;
    }
    let area = root.margin(top, 0, 0, 0);

    // The y axis: log10 of the values on a log scale (whole decades), else the values.
    let log = b.log();
    let tf = |v: f64| if log { v.log10() } else { v };
    let (lo, hi) = b.values().fold((f64::INFINITY, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (y0, y1) = if log { (tf(lo).floor(), (tf(hi) + 0.25).ceil()) } else { (0.0, hi * 1.15) };
    let ticks: Vec<f64> = if log { (y0 as i32..=y1 as i32).map(f64::from).collect() } else { linear_ticks(y1) };
    let n = b.groups.len();
    let k = b.series.len().max(1);

    let mut chart = ChartBuilder::on(&area)
        .margin_top(10)
        .margin_left(10)
        .margin_right(20)
        .x_label_area_size(40)
        .y_label_area_size(85)
        .build_cartesian_2d(-0.5..n as f64 - 0.5, y0..y1)
        .map_err(err)?;
    chart.configure_mesh().disable_mesh().x_labels(0).y_labels(0).draw().map_err(err)?;
    let (xs, ys) = chart.plotting_area().get_pixel_range();

    // Grid, tick labels and the axis title.
    let grid = |v: f64, style: ShapeStyle| {
        let (_, y) = chart.backend_coord(&(0.0, v));
        root.draw(&PathElement::new(vec![(xs.start, y), (xs.end, y)], style)).map_err(err)
    };
    if log {
        for d in y0 as i32..y1 as i32 {
            for m in 2..10 {
                grid(f64::from(d) + f64::from(m).log10(), RGBColor(235, 235, 235).stroke_width(1))?;
            }
        }
    }
    for &t in &ticks {
        if t > y0 {
            grid(t, RGBColor(200, 200, 200).stroke_width(1))?;
        }
        let (x, y) = chart.backend_coord(&(-0.5, t));
        root.draw(&PathElement::new(vec![(x - 5, y), (x, y)], BLACK.stroke_width(1))).map_err(err)?;
        let label = (b.fmt)(if log { 10f64.powf(t) } else { t });
        p.text(&root, &label, (x - 8, y), 14.0, &BLACK, anchor(HPos::Right, VPos::Center))?;
    }
    let y_desc = if log { format!("{} (log scale)", b.y_desc) } else { b.y_desc.clone() };
    p.text(
        &root,
        &y_desc,
        (area.get_base_pixel().0 + 16, (ys.start + ys.end) / 2),
        15.0,
        &BLACK,
        Anchor { h: HPos::Center, v: VPos::Center, up: true },
    )?;

    // Engine names under their groups.
    for (i, g) in b.groups.iter().enumerate() {
        let (x, y) = chart.backend_coord(&(i as f64, y0));
        p.text(&root, g, (x, y + 10), 15.0, &BLACK, anchor(HPos::Center, VPos::Top))?;
    }

    // The bars, each with its value above it ("n/a" where not measured).
    let width = 0.8 / k as f64;
    let label_size = if n * k > 20 { 11.0 } else { 13.0 };
    for (s, (_, values)) in b.series.iter().enumerate() {
        let color = PALETTE[s % PALETTE.len()];
        let left = |i: usize| i as f64 - 0.4 + s as f64 * width;
        let bars = values.iter().enumerate().filter_map(|(i, v)| {
            let v = (*v).filter(|v| v.is_finite() && *v > 0.0)?;
            Some(Rectangle::new(
                [(left(i) + width * 0.06, y0), (left(i) + width * 0.94, tf(v).max(y0))],
                color.filled(),
            ))
        });
        chart.draw_series(bars).map_err(err)?;
        for (i, v) in values.iter().enumerate() {
            let (text, top, color) = match v.filter(|v| v.is_finite() && *v > 0.0) {
                Some(v) => ((b.fmt)(v), tf(v).max(y0), &BLACK),
                None => ("n/a".to_string(), y0, &GREY),
            };
            let (x, y) = chart.backend_coord(&(left(i) + width / 2.0, top));
            p.text(&root, &text, (x, y - 3), label_size, color, anchor(HPos::Center, VPos::Bottom))?;
        }
    }
    root.present().map_err(err)?;
    Ok(())
}

/// A one-line legend centred at height `y`: a swatch and the series name each.
fn legend<DB: DrawingBackend>(p: &mut Painter, area: &DrawingArea<DB, Shift>, b: &Bars, y: i32) -> anyhow::Result<()> {
    let font = FontDesc::new(FontFamily::SansSerif, 14.0, FontStyle::Normal);
    let (swatch, gap, pad) = (14, 6, 24);
    let widths: Vec<i32> = b
        .series
        .iter()
        .map(|(name, _)| font.box_size(name).map(|(w, _)| w as i32).map_err(|e| anyhow!("{e:?}")))
        .collect::<Result<_, _>>()?;
    let total: i32 = widths.iter().map(|w| swatch + gap + w).sum::<i32>() + pad * (widths.len() as i32 - 1);
    let mut x = (area.dim_in_pixel().0 as i32 - total) / 2;
    for (s, ((name, _), w)) in b.series.iter().zip(&widths).enumerate() {
        area.draw(&Rectangle::new([(x, y - 7), (x + swatch, y + 7)], PALETTE[s % PALETTE.len()].filled()))
            .map_err(|e| anyhow!("{e:?}"))?;
        p.text(area, name, (x + swatch + gap, y), 14.0, &BLACK, anchor(HPos::Left, VPos::Center))?;
        x += swatch + gap + w + pad;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::report as synthetic;

    #[test]
    fn chart_writes_svg() {
        let dir = tempfile::tempdir().unwrap();
        let r = synthetic();
        let files = draw(&r, dir.path()).unwrap();
        let names: Vec<String> = files.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
        for stem in ["w1-throughput", "w1-latency", "w2-throughput", "w2-handoff"] {
            let name = format!("{stem}.svg");
            assert!(names.contains(&name), "{name} not in {names:?}");
            assert!(dir.path().join(&name).is_file(), "{name} not written");
        }
        assert_eq!(files.len(), 4, "{names:?}");
        for f in &files {
            let text = std::fs::read_to_string(f).unwrap();
            assert!(text.starts_with("<svg"), "{}", f.display());
            assert!(text.contains("zookeeper") && text.contains("fencelock"), "{} lacks engine names", f.display());
        }
    }

    /// No cells: no charts, no error. Only W2: only the W2 charts.
    #[test]
    fn chart_skips_empty() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = synthetic();
        let all = std::mem::take(&mut r.cells);
        assert!(draw(&r, dir.path()).unwrap().is_empty());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        r.cells = all.into_iter().filter(|c| c.workload == "W2").collect();
        let files = draw(&r, dir.path()).unwrap();
        assert_eq!(files.len(), 2, "{files:?}");
        assert!(files.iter().all(|f| f.file_name().unwrap().to_string_lossy().starts_with("w2-")));
    }

    #[test]
    fn chart_compact_numbers() {
        assert_eq!(compact(123_456.0), "123k");
        assert_eq!(compact(12_345.0), "12.3k");
        assert_eq!(compact(2_500_000.0), "2.5M");
        assert_eq!(compact(950.0), "950");
        assert_eq!(compact(0.0421), "0.042");
        assert_eq!(compact(1.5), "1.5");
        assert_eq!(compact(100.0), "100");
    }
}
