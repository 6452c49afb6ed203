//! Locating the binaries under test from an integration test: workspace binaries that are not
//! this package's own (railrun, railperf, railcompare, ...) are built on first use with
//! `cargo build` into the running test's target directory and profile.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The target profile directory of the running test (`target/debug` for `target/debug/deps/t-…`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("deps dir");
    deps.parent().expect("profile dir").to_path_buf()
}

/// Runs `cargo build ARGS` on this workspace into the running test's target directory and
/// profile (`--release` / `--profile P` as the test was built) and returns the profile
/// directory, where the binaries land. Panics when the build fails.
pub fn cargo_build(args: &[&str]) -> PathBuf {
    let dir = profile_dir();
    let target = dir.parent().expect("target dir").to_path_buf();
    let cargo = std::env::var("CARGO")
        .ok()
        .or(option_env!("CARGO").map(String::from))
        .unwrap_or_else(|| "cargo".into());
    let mut c = Command::new(cargo);
    c.arg("build")
        .arg("-q")
        .arg("--manifest-path")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml"))
        .args(args)
        .arg("--target-dir")
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
    let what = format!("cargo build {}", args.join(" "));
    let st = c.status().unwrap_or_else(|e| panic!("run {what}: {e}"));
    assert!(st.success(), "{what} failed");
    dir
}

/// Binary `name` of workspace package `package`: `<NAME>_BIN` (e.g. `RAILRUN_BIN`, `-` as `_`)
/// when set, else built with [`cargo_build`].
pub fn workspace_bin(package: &str, name: &str) -> PathBuf {
    let var = format!("{}_BIN", name.to_ascii_uppercase().replace('-', "_"));
    if let Some(p) = std::env::var_os(&var) {
        return PathBuf::from(p);
    }
    cargo_build(&["-p", package, "--bin", name]).join(name)
}

/// The railrun binary under test: `RAILRUN_BIN`, else built once with `cargo build -p railrun`.
pub fn railrun() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| workspace_bin("railrun", "railrun"))
}
