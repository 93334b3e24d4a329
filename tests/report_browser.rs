//! `report.html` as a browser shows it: rendered by headless Chromium, the screenshot is
//! read back and checked — the page opens on the policy comparison (its bars, drawn in
//! a colour no other chart uses, are on the first screen), and the charts scale with the
//! page: the same bar is as much longer in a wider window as the page's column is wider.
//!
//! Skipped, and saying so, where no Chromium is installed (`./test.sh` installs Debian's
//! `chromium`); `IOSHARE_REQUIRE_CHROMIUM=1` turns the skip into a failure.

use ioshare::scenario::Scenario;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The comparison chart's bar colour (`report/compare.rs`, used by no other chart).
const BAR: [u8; 3] = [0, 90, 150];
/// The `none` row's bar colour.
const NONE_BAR: [u8; 3] = [176, 196, 222];

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

/// The longest horizontal run of pixels of exactly `colour` in any row: a filled bar,
/// not the odd anti-aliased pixel of some text.
fn longest_run(rgb: &[u8], width: u32, height: u32, colour: [u8; 3]) -> u32 {
    let mut best = 0;
    for y in 0..height {
        let mut run = 0;
        for x in 0..width {
            if pixel(rgb, width, x, y) == colour {
                run += 1;
                best = best.max(run);
            } else {
                run = 0;
            }
        }
    }
    best
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
        let (test, why) = (
            "report_opens_on_the_comparison_and_uses_the_page_width",
            "no chromium on PATH",
        );
        eprintln!("SKIPPED {test}: {why}");
        // `./test.sh` lists the skipped tests at the end.
        if let Some(log) = std::env::var_os("IOSHARE_SKIPPED_LOG") {
            use std::io::Write as _;
            if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(log) {
                let _ = writeln!(f, "{test}: {why}");
            }
        }
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let page = report(dir.path());
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.contains("others (5 tenants, summed)"),
        "legend not cut to the top 7"
    );

    let mut bars = Vec::new();
    for w in [1000u32, 1400] {
        let (width, height, rgb) = screenshot(&browser, &page, w, 1000);
        assert_eq!(width, w, "screenshot width");
        assert!(height >= 600, "screenshot only {height} px high");
        // The first screen shows the comparison's bars: the longest (none's share error
        // is near 100 %, sfq's near 0) and none's, in its own colour.
        let longest = longest_run(&rgb, width, height, BAR);
        assert!(
            longest >= 40,
            "no comparison bar on the first screen at {w} px (longest run {longest} px)"
        );
        let none = longest_run(&rgb, width, height, NONE_BAR);
        assert!(
            none >= 40,
            "no `none` bar on the first screen at {w} px ({none} px)"
        );
        bars.push(longest.max(none));
    }
    // The page's column is 1000 − 2 × 16 px wide in the narrow window and 1,100 px in the
    // wide one: charts that take the column's width draw the same bar 1100 / 968 ≈ 1.14
    // times longer; fixed-size ones would draw it the same length (or overflow).
    let ratio = f64::from(bars[1]) / f64::from(bars[0]);
    assert!(
        (1.08..1.2).contains(&ratio),
        "the longest bar is {} px at 1000 px and {} px at 1400 px (ratio {ratio:.3}, expected ≈ 1.14)",
        bars[0],
        bars[1]
    );
}
