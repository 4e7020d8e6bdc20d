//! Line plots of latency or bandwidth against message size, one line per series,
//! written as SVG or PNG with `plotters` (used by `halo simulate` and the benchmarks), and
//! linear plots of a value per training step (`halo train --plot`).

use halo::{Error, Result};
use plotters::coord::ranged1d::ValueFormatter;
use plotters::prelude::*;
use std::path::Path;

/// One line: a name and (bytes per peer, value) points, sizes ascending.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// (x, y) points; x is bytes per peer, y the value (> 0 for the log scale).
    pub points: Vec<(f64, f64)>,
}

const COLOURS: [RGBColor; 7] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(23, 190, 207),
];

/// Writes a log-log line plot of `series` to `path`: SVG, or PNG when the file name
/// ends in `.png`. The x axis is bytes per peer.
///
/// # Errors
/// [`Error::InvalidArgument`] when no point is positive; [`Error::SystemError`] when
/// the file cannot be written.
pub fn line_plot(path: &Path, title: &str, y_label: &str, series: &[Series]) -> Result<()> {
    let axes = Axes {
        title,
        x_label: "bytes per peer",
        y_label,
        log_x: true,
        y_floor: None,
    };
    plot(path, &axes, series)
}

/// Writes a plot of `series` against a step count to `path`: SVG, or PNG when the file
/// name ends in `.png`. The x axis is linear; the y axis logarithmic (a loss curve) when
/// `y_floor` is `None`, else linear from `y_floor` (or lower if a point is; an
/// imbalance curve starts at 1).
///
/// # Errors
/// As [`line_plot`].
pub fn step_plot(
    path: &Path,
    title: &str,
    y_label: &str,
    y_floor: Option<f64>,
    series: &[Series],
) -> Result<()> {
    let axes = Axes {
        title,
        x_label: "step",
        y_label,
        log_x: false,
        y_floor,
    };
    plot(path, &axes, series)
}

/// A plot's texts and scales.
struct Axes<'a> {
    title: &'a str,
    x_label: &'a str,
    y_label: &'a str,
    /// Log x (bytes) or linear x (steps).
    log_x: bool,
    /// `None`: log y; `Some(floor)`: linear y from `floor`.
    y_floor: Option<f64>,
}

impl Axes<'_> {
    /// Whether a point can be drawn on these scales.
    fn shows(&self, p: (f64, f64)) -> bool {
        let x_ok = if self.log_x {
            p.0 > 0.0
        } else {
            p.0.is_finite()
        };
        let y_ok = match self.y_floor {
            None => p.1 > 0.0,
            Some(_) => p.1.is_finite(),
        };
        x_ok && y_ok
    }
}

fn plot(path: &Path, axes: &Axes<'_>, series: &[Series]) -> Result<()> {
    let pts = series
        .iter()
        .flat_map(|s| s.points.iter())
        .filter(|p| axes.shows(**p));
    let y_start = axes.y_floor.unwrap_or(f64::MAX);
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, y_start, f64::MIN);
    for &(x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        return Err(Error::invalid_argument(
            "nothing to plot: no point that fits the axes",
        ));
    }
    if y1 <= y0 {
        y1 = y0 + 1.0;
    }
    load_font()?;
    let bounds = (x0, x1, y0, y1);
    let png = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("png"));
    let drawn = if png {
        draw(
            BitMapBackend::new(path, (900, 560)).into_drawing_area(),
            axes,
            series,
            bounds,
        )
    } else {
        draw(
            SVGBackend::new(path, (900, 560)).into_drawing_area(),
            axes,
            series,
            bounds,
        )
    };
    drawn.map_err(|e| Error::SystemError {
        message: format!("cannot write the plot {}: {e}", path.display()),
    })
}

type Bounds = (f64, f64, f64, f64);

/// Where plots look for their TrueType font (Debian's fonts-dejavu-core first).
const FONT_PATHS: [&str; 4] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];
/// Registers the plots' font once per process (`HALO_PLOT_FONT` names another file).
/// plotters draws text with `ab_glyph`, which needs the font's bytes for the rest of
/// the process, so they are kept.
fn load_font() -> Result<()> {
    static FONT: std::sync::OnceLock<std::result::Result<(), String>> = std::sync::OnceLock::new();
    FONT.get_or_init(|| {
        let mut tried: Vec<String> = Vec::new();
        let env = halo_params::PLOT_FONT.raw();
        for p in env.iter().map(String::as_str).chain(FONT_PATHS) {
            match std::fs::read(p) {
                Ok(bytes) => {
                    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                    return plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
                        .map_err(|_| format!("{p} is not a TrueType font"));
                }
                Err(_) => tried.push(p.to_string()),
            }
        }
        Err(format!(
            "plots need a TrueType font and none was found (tried {}); install one \
             (Debian: apt-get install fonts-dejavu-core) or set HALO_PLOT_FONT",
            tried.join(", ")
        ))
    })
    .clone()
    .map_err(Error::invalid_argument)
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    axes: &Axes<'_>,
    series: &[Series],
    (x0, x1, y0, y1): Bounds,
) -> std::result::Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(axes.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70);
    let log_y = (y0 / 1.5..y1 * 1.5).log_scale();
    let lin_y = y0..y1 + 0.05 * (y1 - y0);
    let pad = ((x1 - x0) * 0.02).max(0.5);
    let lin_x = x0 - pad..x1 + pad;
    let steps = |x: &f64| format!("{x:.0}");
    match (axes.log_x, axes.y_floor) {
        (true, _) => {
            let chart = builder
                .build_cartesian_2d((x0 / 1.5..x1 * 1.5).log_scale(), log_y)
                .map_err(e)?;
            lines(chart, axes, series, &|x| fmt_axis_bytes(*x), true)?;
        }
        (false, None) => {
            let chart = builder.build_cartesian_2d(lin_x, log_y).map_err(e)?;
            lines(chart, axes, series, &steps, false)?;
        }
        (false, Some(_)) => {
            let chart = builder.build_cartesian_2d(lin_x, lin_y).map_err(e)?;
            lines(chart, axes, series, &steps, false)?;
        }
    }
    root.present().map_err(e)?;
    Ok(())
}

/// The mesh, the series (with point markers when `markers`) and the legend of a chart
/// whose coordinates are f64 on both axes, whatever their scales.
fn lines<'a, DB, X, Y>(
    mut chart: ChartContext<'a, DB, Cartesian2d<X, Y>>,
    axes: &Axes<'_>,
    series: &[Series],
    x_format: &dyn Fn(&f64) -> String,
    markers: bool,
) -> std::result::Result<(), String>
where
    DB: DrawingBackend + 'a,
    X: Ranged<ValueType = f64> + ValueFormatter<f64>,
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    chart
        .configure_mesh()
        .x_desc(axes.x_label)
        .y_desc(axes.y_label)
        .x_label_formatter(x_format)
        .y_label_formatter(&|y| fmt_value(*y))
        .draw()
        .map_err(e)?;
    for (i, s) in series.iter().enumerate() {
        let c = COLOURS[i % COLOURS.len()];
        let data: Vec<(f64, f64)> = s
            .points
            .iter()
            .copied()
            .filter(|p| axes.shows(*p))
            .collect();
        chart
            .draw_series(LineSeries::new(data.clone(), c.stroke_width(2)))
            .map_err(e)?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        if markers {
            chart
                .draw_series(data.into_iter().map(|p| Circle::new(p, 3, c.filled())))
                .map_err(e)?;
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(if axes.log_x {
            SeriesLabelPosition::UpperLeft
        } else {
            SeriesLabelPosition::UpperRight
        })
        .draw()
        .map_err(e)?;
    Ok(())
}

/// A y tick with at most three significant digits (`0.6`, `12.5`, `1.2e5`), where the
/// default formatter prints a float's rounding noise (`0.6000000000001`).
fn fmt_value(y: f64) -> String {
    if y == 0.0 {
        return "0".to_string();
    }
    let mag = y.abs().log10().floor();
    if !(-3.0..5.0).contains(&mag) {
        return format!("{y:.1e}");
    }
    let decimals = (2.0 - mag).max(0.0) as usize;
    let t = format!("{y:.decimals$}");
    if t.contains('.') {
        t.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        t
    }
}

/// An axis tick of a log scale, whose ticks fall on powers of ten: `100 B`, `10 kB`,
/// `1 MB` (decimal units, so that the ticks read as round numbers).
fn fmt_axis_bytes(x: f64) -> String {
    let short = |v: f64| {
        let t = format!("{v:.2}");
        t.trim_end_matches('0').trim_end_matches('.').to_string()
    };
    let units = [("GB", 1e9), ("MB", 1e6), ("kB", 1e3)];
    for (u, f) in units {
        if x >= f * 0.999 {
            return format!("{} {u}", short(x / f));
        }
    }
    format!("{} B", short(x))
}

/// `1 KiB`, `16 MiB`, `512 B`.
pub fn fmt_bytes(x: f64) -> String {
    let units = [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (u, f) in units {
        if x >= f as f64 {
            let v = x / f as f64;
            return if v.fract() == 0.0 {
                format!("{v:.0} {u}")
            } else {
                format!("{v:.1} {u}")
            };
        }
    }
    format!("{x:.0} B")
}

/// Parses `1K`, `16M`, `4096`, `2G` (powers of 1024) into bytes.
pub fn parse_bytes(s: &str) -> Result<usize> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let unit = s[i..].to_ascii_lowercase();
            let m: usize = match unit.trim_end_matches("ib").trim_end_matches('b') {
                "" => 1,
                "k" => 1 << 10,
                "m" => 1 << 20,
                "g" => 1 << 30,
                _ => {
                    return Err(Error::invalid_argument(format!(
                        "'{s}': unknown unit (use K, M or G)"
                    )));
                }
            };
            (&s[..i], m)
        }
        None => (s, 1),
    };
    num.trim()
        .parse::<usize>()
        .ok()
        .and_then(|v| v.checked_mul(mult))
        .ok_or_else(|| Error::invalid_argument(format!("'{s}' is not a size in bytes")))
}
