//! `railrun plan --html` in a real browser (Debian's Chromium, headless): the page loads without
//! script errors, each of its three views renders (DOM markers the page sets after drawing, and
//! the drawn elements), and each view's screenshot has content a blank page does not. The page
//! fetches nothing: no `src`/`href` to anywhere.
//!
//! Needs `chromium` (or `$RAILRING_CHROMIUM`); without it the test prints SKIPPED.

use railring_tests::proc::{collect, wait_timeout, ScratchDir};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

fn chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("RAILRING_CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find_map(|n| {
            std::env::split_paths(&std::env::var_os("PATH")?)
                .map(|d| d.join(n))
                .find(|p| p.is_file())
        })
}

/// One headless run with a fresh profile; (stdout, stderr).
fn headless(chrome: &Path, scratch: &Path, args: &[String]) -> (String, String) {
    let profile = ScratchDir::new("rr-chromium-profile");
    let mut cmd = Command::new(chrome);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-quic",
        "--no-first-run",
        "--enable-logging=stderr",
        "--v=0",
        "--window-size=1300,1100",
    ])
    .arg(format!("--user-data-dir={}", profile.path().display()))
    .args(args)
    .current_dir(scratch)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("start chromium");
    let (out, err) = collect(&mut child);
    let st = wait_timeout(&mut child, Duration::from_secs(90));
    if st.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    assert!(
        st.is_some_and(|s| s.success()),
        "chromium {args:?} failed or hung:\n{err}"
    );
    (out, err)
}

/// (width, height) of a PNG, from its IHDR chunk.
fn png_size(bytes: &[u8]) -> (u32, u32) {
    assert!(
        bytes.len() > 24 && &bytes[..8] == b"\x89PNG\r\n\x1a\n",
        "not a PNG"
    );
    assert_eq!(&bytes[12..16], b"IHDR");
    let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    (be(&bytes[16..20]), be(&bytes[20..24]))
}

/// The value of attribute `name` on the dumped `<body ...>` tag.
fn body_attr(dom: &str, name: &str) -> Option<String> {
    let start = dom.find("<body")?;
    let tag = &dom[start..start + dom[start..].find('>')?];
    let pat = format!("{name}=\"");
    let i = tag.find(&pat)? + pat.len();
    Some(tag[i..i + tag[i..].find('"')?].to_string())
}

#[test]
fn plan_page_renders_every_view_in_chromium() {
    let Some(chrome) = chromium() else {
        eprintln!("SKIPPED: plan_page_renders_every_view_in_chromium: no chromium (apt-get install chromium, or set RAILRING_CHROMIUM)");
        return;
    };
    let dir = ScratchDir::new("rr-plan-html");
    let page = dir.path().join("plan.html");
    let fabric = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fabrics/h100-rail-pod.json");
    let out = Command::new(railring_tests::bins::railrun())
        .args(["plan", "--fabric"])
        .arg(&fabric)
        .args(["-b", "1M", "-e", "64M", "-f", "8", "--html"])
        .arg(&page)
        .output()
        .expect("run railrun plan");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let html = std::fs::read_to_string(&page).unwrap();
    // self-contained: nothing to fetch
    for bad in [
        "src=",
        "href=",
        "<link",
        "@import",
        "url(http",
        "fetch(",
        "XMLHttpRequest",
    ] {
        assert!(
            !html.contains(bad),
            "the page refers to something outside itself: {bad}"
        );
    }
    let url = |frag: &str| format!("file://{}#{frag}", page.display());
    // each view: rendered, no script error, its elements drawn
    let views = [
        ("fabric", "data-rendered-fabric", "class=\"link\""),
        ("node", "data-rendered-node", "class=\"gpu\""),
        ("anim&step=2", "data-rendered-anim", "class=\"xfer\""),
    ];
    for (frag, marker, element) in views {
        let (dom, log) = headless(&chrome, dir.path(), &["--dump-dom".into(), url(frag)]);
        assert!(!log.contains("Uncaught"), "{frag}: script error:\n{log}");
        assert_eq!(
            body_attr(&dom, "data-errors"),
            None,
            "{frag}: page recorded an error"
        );
        let m = body_attr(&dom, marker)
            .unwrap_or_else(|| panic!("{frag}: no {marker} in\n{}", &dom[..dom.len().min(2000)]));
        assert_ne!(m, "0", "{frag}: {marker}={m}");
        let view = frag.split('&').next().unwrap();
        assert_eq!(body_attr(&dom, "data-view").as_deref(), Some(view));
        assert!(dom.matches(element).count() > 2, "{frag}: few {element}");
        match view {
            // 8 GPUs and 8 NICs on the node view; the anim: step 3 of RS + 2x3 ring steps + AG
            "node" => assert_eq!(m, "8"),
            "anim" => {
                assert!(m.starts_with("3/8:"), "{m}");
                assert_eq!(dom.matches("class=\"xfer\"").count(), 32);
            }
            _ => assert!(m.parse::<usize>().unwrap() > 50, "{m} links drawn"),
        }
    }
    // screenshots: each view has far more content than a blank page, and they differ
    std::fs::write(
        dir.path().join("blank.html"),
        "<!DOCTYPE html><html><body></body></html>",
    )
    .unwrap();
    let shot = |name: &str, target: String| -> Vec<u8> {
        let png = dir.path().join(format!("{name}.png"));
        headless(
            &chrome,
            dir.path(),
            &[format!("--screenshot={}", png.display()), target],
        );
        let b = std::fs::read(&png).unwrap_or_else(|e| panic!("{name}: no screenshot: {e}"));
        assert_eq!(png_size(&b), (1300, 1100), "{name}");
        b
    };
    let blank = shot(
        "blank",
        format!("file://{}", dir.path().join("blank.html").display()),
    );
    let shots: Vec<Vec<u8>> = ["fabric", "node", "anim&step=2"]
        .iter()
        .map(|f| shot(f.split('&').next().unwrap(), url(f)))
        .collect();
    for (i, s) in shots.iter().enumerate() {
        assert!(
            s.len() > 5 * blank.len(),
            "view {i}: {} bytes vs blank {}",
            s.len(),
            blank.len()
        );
        for t in &shots[i + 1..] {
            assert_ne!(s, t, "two views rendered the same picture");
        }
    }
}
