//! RDMA devices: a usable port ([`HcaPort`]), and `RAILRING_IB_HCA`: which RDMA devices (and ports) carry traffic, in NCCL's `NCCL_IB_HCA`
//! grammar:
//!
//! - a comma-separated list of `name` or `name:port` entries (`mlx5_0:1,mlx5_1`);
//! - names are prefixes (`mlx5` matches `mlx5_0` ... `mlx5_17`) unless the list starts with `=`,
//!   which makes them exact (`=mlx5_1` does not match `mlx5_10`);
//! - a leading `^` excludes the listed devices instead (`^mlx5_3`, `^=mlx5_3:1`);
//! - an entry without `:port` matches every port of the device.
//!
//! Parsing is strict about what NCCL would silently misread (a port that is not a number, an
//! empty name) and reports it as an error naming the variable: never a panic.

use std::fmt;

/// One usable HCA port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HcaPort {
    pub device: String,
    pub port: u8,
}

/// One `name[:port]` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HcaEntry {
    pub name: String,
    pub port: Option<u8>,
}

/// A parsed `RAILRING_IB_HCA` value.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct HcaFilter {
    /// `^`: the entries are exclusions.
    pub exclude: bool,
    /// `=`: names match exactly instead of by prefix.
    pub exact: bool,
    pub entries: Vec<HcaEntry>,
}

/// Why a `RAILRING_IB_HCA` value was rejected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HcaParseError(pub String);

impl fmt::Display for HcaParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for HcaParseError {}

impl HcaFilter {
    /// Parse a value. An empty value (or only `^` / `=`) yields a filter that selects every
    /// device (an empty inclusion list means "no restriction", an empty exclusion list excludes
    /// nothing), as NCCL does.
    pub fn parse(s: &str) -> Result<HcaFilter, HcaParseError> {
        let mut rest = s.trim();
        let exclude = rest.starts_with('^');
        if exclude {
            rest = rest[1..].trim_start();
        }
        let exact = rest.starts_with('=');
        if exact {
            rest = rest[1..].trim_start();
        }
        let mut entries = Vec::new();
        for raw in rest.split(',') {
            let item = raw.trim();
            if item.is_empty() {
                continue;
            }
            let (name, port) = match item.split_once(':') {
                None => (item, None),
                Some((n, p)) => {
                    let p = p.trim();
                    let port: u8 = p.parse().map_err(|_| {
                        HcaParseError(format!(
                            "entry '{item}': port '{p}' is not a number between 0 and 255"
                        ))
                    })?;
                    (n.trim(), Some(port))
                }
            };
            if name.is_empty() {
                return Err(HcaParseError(format!("entry '{item}' has no device name")));
            }
            if name.contains(['^', '=', ' ']) {
                return Err(HcaParseError(format!(
                    "entry '{item}': '^' and '=' may only start the whole list"
                )));
            }
            entries.push(HcaEntry {
                name: name.to_string(),
                port,
            });
        }
        Ok(HcaFilter {
            exclude,
            exact,
            entries,
        })
    }

    fn entry_matches(&self, e: &HcaEntry, device: &str, port: u8) -> bool {
        let name_ok = if self.exact {
            device == e.name
        } else {
            device.starts_with(e.name.as_str())
        };
        name_ok && e.port.is_none_or(|p| p == port)
    }

    /// Whether `device` port `port` may be used.
    pub fn matches(&self, device: &str, port: u8) -> bool {
        if self.entries.is_empty() {
            return true;
        }
        let hit = self
            .entries
            .iter()
            .any(|e| self.entry_matches(e, device, port));
        hit != self.exclude
    }
}

impl fmt::Display for HcaFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.exclude {
            f.write_str("^")?;
        }
        if self.exact {
            f.write_str("=")?;
        }
        for (i, e) in self.entries.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(&e.name)?;
            if let Some(p) = e.port {
                write!(f, ":{p}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> HcaFilter {
        HcaFilter::parse(s).unwrap()
    }

    #[test]
    fn prefixes_and_ports() {
        let f = p("mlx5_0:1,mlx5_1");
        assert!(!f.exclude && !f.exact);
        assert_eq!(
            f.entries,
            vec![
                HcaEntry {
                    name: "mlx5_0".into(),
                    port: Some(1)
                },
                HcaEntry {
                    name: "mlx5_1".into(),
                    port: None
                }
            ]
        );
        assert!(f.matches("mlx5_0", 1));
        assert!(!f.matches("mlx5_0", 2), "port restricted to 1");
        assert!(f.matches("mlx5_1", 2), "no port: every port");
        assert!(f.matches("mlx5_10", 1), "prefix match without '='");
        assert!(!f.matches("mlx4_0", 1));
    }

    #[test]
    fn exact() {
        let f = p("=mlx5_1");
        assert!(f.exact);
        assert!(f.matches("mlx5_1", 1));
        assert!(!f.matches("mlx5_10", 1));
    }

    #[test]
    fn exclude() {
        let f = p("^mlx5_3");
        assert!(f.exclude);
        assert!(!f.matches("mlx5_3", 1));
        assert!(!f.matches("mlx5_30", 1), "prefix exclusion");
        assert!(f.matches("mlx5_0", 1));
        let f = p("^=mlx5_3:1");
        assert!(f.exclude && f.exact);
        assert!(!f.matches("mlx5_3", 1));
        assert!(f.matches("mlx5_3", 2), "only port 1 excluded");
        assert!(f.matches("mlx5_30", 1), "exact exclusion");
    }

    #[test]
    fn empty_selects_everything() {
        for s in ["", "  ", "^", "=", "^=", ",,"] {
            let f = p(s);
            assert!(f.matches("mlx5_0", 1), "{s:?}");
            assert!(f.matches("anything", 7), "{s:?}");
        }
    }

    #[test]
    fn whitespace_is_trimmed() {
        let f = p(" mlx5_0 : 1 , mlx5_2 ");
        assert!(f.matches("mlx5_0", 1));
        assert!(f.matches("mlx5_2", 1));
        assert!(!f.matches("mlx5_1", 1));
    }

    #[test]
    fn errors_are_reported_not_panics() {
        for bad in [
            "mlx5_0:x",
            "mlx5_0:",
            "mlx5_0:256",
            ":1",
            "mlx5_0,^mlx5_1",
            "a=b",
        ] {
            let e = HcaFilter::parse(bad).unwrap_err();
            assert!(!e.0.is_empty(), "{bad}");
        }
    }

    #[test]
    fn display_round_trips() {
        for s in ["mlx5_0:1,mlx5_1", "^=mlx5_3:1", "=a,b:2", "^x"] {
            let f = p(s);
            assert_eq!(f.to_string(), s);
            assert_eq!(p(&f.to_string()), f);
        }
    }
}
