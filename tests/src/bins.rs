//! Locating the binaries under test from an integration test.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The target profile directory of the running test (`target/debug` for `target/debug/deps/t-…`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("deps dir");
    deps.parent().expect("profile dir").to_path_buf()
}

/// The railrun binary under test: `RAILRUN_BIN`, else built once with `cargo build -p railrun`
/// into this test's target directory and profile.
pub fn railrun() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("RAILRUN_BIN") {
            return PathBuf::from(p);
        }
        let dir = profile_dir();
        let target = dir.parent().expect("target dir").to_path_buf();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut c = Command::new(cargo);
        c.arg("build")
            .arg("-q")
            .arg("--manifest-path")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml"))
            .args(["-p", "railrun", "--bin", "railrun", "--target-dir"])
            .arg(&target);
        match dir.file_name().and_then(|s| s.to_str()) {
            Some("debug") | None => {}
            Some("release") => {
                c.arg("--release");
            }
            Some(other) => {
                c.args(["--profile", other]);
            }
        }
        let st = c.status().expect("run cargo build -p railrun");
        assert!(st.success(), "cargo build -p railrun failed");
        dir.join("railrun")
    })
}
