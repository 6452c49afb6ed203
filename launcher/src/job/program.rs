//! Finding executables: the program the ranks run ([`resolve_program`]) and tools railrun itself
//! runs, such as `srun` ([`find_in_path`]).

use std::path::{Path, PathBuf};

/// Find the program: a name with a `/` is used as is (made absolute); otherwise `$PATH`, then
/// the directory holding the railrun executable.
pub fn resolve_program(name: &str) -> Result<PathBuf, String> {
    let cwd =
        std::env::current_dir().map_err(|e| format!("cannot read the current directory: {e}"))?;
    if name.contains('/') {
        return Ok(cwd.join(name).components().collect());
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let dir = if dir.as_os_str().is_empty() {
                cwd.clone()
            } else {
                cwd.join(dir)
            };
            let c = dir.join(name);
            if is_executable(&c) {
                return Ok(c.components().collect());
            }
        }
    }
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf));
    if let Some(d) = &exe_dir {
        let c = d.join(name);
        if is_executable(&c) {
            return Ok(c);
        }
    }
    Err(format!(
        "program `{name}` not found: not in $PATH{} (give a path with a `/` to run a program from elsewhere)",
        exe_dir.map(|d| format!(" nor next to railrun in {}", d.display())).unwrap_or_default()
    ))
}

/// `name` in `$PATH` (an executable regular file), as an absolute path.
pub fn find_in_path(name: &str, env: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let path = env("PATH")?;
    std::env::split_paths(&path)
        .filter(|d| d.is_absolute())
        .map(|d| d.join(name))
        .find(|c| is_executable(c))
}

/// A regular file with an execute bit.
fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_lookup() {
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(
            resolve_program("./x/../prog").unwrap(),
            cwd.join("x/../prog").components().collect::<PathBuf>()
        );
        assert_eq!(
            resolve_program("/bin/true").unwrap(),
            PathBuf::from("/bin/true")
        );
        let sh = resolve_program("sh").unwrap();
        assert!(sh.is_absolute() && sh.ends_with("sh"), "{}", sh.display());
        let e = resolve_program("railrun-no-such-program").unwrap_err();
        assert!(
            e.contains("railrun-no-such-program") && e.contains("not found"),
            "{e}"
        );
    }

    #[test]
    fn path_lookup() {
        let env =
            |k: &str| (k == "PATH").then(|| "relative:/nonexistent:/bin:/usr/bin".to_string());
        let sh = find_in_path("sh", &env).expect("sh in /bin or /usr/bin");
        assert!(sh.is_absolute() && sh.ends_with("sh"), "{}", sh.display());
        assert_eq!(find_in_path("railrun-no-such-program", &env), None);
        assert_eq!(find_in_path("sh", &|_: &str| None), None);
    }
}
