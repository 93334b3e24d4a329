//! `report.html` as a browser shows it: rendered by headless Chromium, the screenshot is
//! read back and checked — the page opens on the policy comparison (its bars are on the
//! first screen), the charts use the page's width at two window sizes, and a
//! many-tenant legend stays inside its chart.
//!
//! Skipped, and saying so, where no Chromium is installed (`./test.sh` installs Debian's
//! `chromium`); `IOSHARE_REQUIRE_CHROMIUM=1` turns the skip into a failure.

use ioshare::scenario::Scenario;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The comparison chart's bar colour (`report/compare.rs`).
const BAR: [u8; 3] = [31, 119, 180];
/// The `none` row's bar colour.
const NONE_BAR: [u8; 3] = [150, 150, 150];

fn chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find_map(|name| {
            std::env::var_os("PATH").and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|p| p.join(name))
                    .find(|p| p.is_file())
            })
        })
}

/// A screenshot of `page` in a `width` × `height` window: (width, height, RGB rows).
fn screenshot(browser: &Path, page: &Path, width: u32, height: u32) -> (u32, u32, Vec<u8>) {
    let dir = page.parent().unwrap();
    let shot = dir.join(format!("shot-{width}.png"));
    let out = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            "--force-device-scale-factor=1",
        ])
        .arg(format!("--user-data-dir={}", dir.join("profile").display()))
        .arg(format!("--window-size={width},{height}"))
        .arg(format!("--screenshot={}", shot.display()))
        .arg(format!("file://{}", page.display()))
        .current_dir(dir)
        .output()
        .expect("run chromium");
    assert!(
        shot.exists(),
        "chromium wrote no screenshot: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&shot).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let channels = info.color_type.samples();
    assert!(
        channels >= 3,
        "unexpected PNG colour type {:?}",
        info.color_type
    );
    let rgb: Vec<u8> = buf[..info.buffer_size()]
        .chunks(channels)
        .flat_map(|p| [p[0], p[1], p[2]])
        .collect();
    (info.width, info.height, rgb)
}

fn pixel(rgb: &[u8], width: u32, x: u32, y: u32) -> [u8; 3] {
    let i = ((y * width + x) * 3) as usize;
    [rgb[i], rgb[i + 1], rgb[i + 2]]
}

fn near(a: [u8; 3], b: [u8; 3]) -> bool {
    a.iter().zip(b).all(|(&x, y)| x.abs_diff(y) <= 6)
}

/// The columns where pixels of `colour` are, leftmost and rightmost, in rows `rows`.
fn extent(
    rgb: &[u8],
    width: u32,
    rows: std::ops::Range<u32>,
    colour: [u8; 3],
) -> Option<(u32, u32)> {
    let mut found: Option<(u32, u32)> = None;
    for y in rows {
        for x in 0..width {
            if near(pixel(rgb, width, x, y), colour) {
                found = Some(found.map_or((x, x), |(l, r)| (l.min(x), r.max(x))));
            }
        }
    }
    found
}

/// The leftmost and rightmost columns that are not white, over all rows.
fn ink(rgb: &[u8], width: u32, height: u32) -> (u32, u32) {
    let mut l = width;
    let mut r = 0;
    for y in 0..height {
        for x in 0..width {
            if pixel(rgb, width, x, y).iter().any(|&c| c < 235) {
                l = l.min(x);
                r = r.max(x);
            }
        }
    }
    (l, r)
}

fn report(dir: &Path) -> PathBuf {
    // Twelve tenants: the share chart names the seven heaviest and sums the rest.
    let mut text = String::from(
        r#"
        duration_s = 3
        policies = ["none", "sfq", "mclock"]
        [device]
        model = "fixed"
        latency_us = 200.0
        parallelism = 8
        "#,
    );
    for i in 0..12 {
        text.push_str(&format!(
            "[[tenant]]\nname = \"tenant-{i}\"\nweight = {}\nworkload = {{ pattern = \"randread\", size = \"4k\", iodepth = 4 }}\n",
            i + 1
        ));
    }
    let s = Scenario::parse(&text, "browser.toml", "browser").unwrap();
    let result = ioshare::sim::run_scenario(&s, false).unwrap();
    let page = dir.join("report.html");
    ioshare::report::write_html(&result, &page).unwrap();
    page
}

#[test]
fn report_opens_on_the_comparison_and_uses_the_page_width() {
    let Some(browser) = chromium() else {
        assert!(
            std::env::var_os("IOSHARE_REQUIRE_CHROMIUM").is_none(),
            "cannot run: no chromium on PATH"
        );
        eprintln!(
            "SKIPPED report_opens_on_the_comparison_and_uses_the_page_width: no chromium on PATH"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let page = report(dir.path());
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.contains("others (5 tenants, summed)"),
        "legend not cut to the top 7"
    );

    let mut rights = Vec::new();
    for (w, h) in [(1000u32, 1000u32), (1400, 1000)] {
        let (width, height, rgb) = screenshot(&browser, &page, w, h);
        assert_eq!((width, height), (w, h), "screenshot size");
        // The first screen shows the comparison's bars, `none` in grey, the others blue.
        let bars = extent(&rgb, width, 0..height, BAR)
            .unwrap_or_else(|| panic!("no comparison bars on the first screen at {w} px"));
        assert!(
            extent(&rgb, width, 0..height, NONE_BAR).is_some(),
            "no `none` bar on the first screen at {w} px"
        );
        // The content spans the page: at 1000 px almost all of it, at 1400 px the
        // page's 1100 px column (centred).
        let (l, r) = ink(&rgb, width, height);
        let span = f64::from(r - l) / f64::from(width);
        let expect = if w == 1000 { 0.9 } else { 0.7 };
        assert!(
            span >= expect,
            "content spans {l}..{r} of {width} px ({span:.2}), expected at least {expect}"
        );
        rights.push(bars.1);
    }
    // The charts scale with the page: the wider window puts the rightmost bar further
    // right.
    assert!(
        rights[1] > rights[0] + 50,
        "the comparison did not widen with the window: rightmost bar at {} then {} px",
        rights[0],
        rights[1]
    );
}
