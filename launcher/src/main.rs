//! railrun: an mpirun-compatible launcher for railring jobs. See `railrun --help`.

use railrun::cli::{self, Command};

fn main() {
    let mut args: Vec<String> = Vec::new();
    for a in std::env::args_os().skip(1) {
        match a.into_string() {
            Ok(s) => args.push(s),
            Err(a) => {
                eprintln!("railrun: argument {a:?} is not valid UTF-8");
                std::process::exit(railrun::job::EXIT_USAGE);
            }
        }
    }
    let code = match cli::parse(&args) {
        Ok(Command::Run(opts)) => railrun::job::run(&opts),
        Ok(Command::Agent { verbose }) => railrun::agent::run(verbose),
        Ok(Command::Topo(rest)) => topo(&rest),
        Ok(Command::Plan(rest)) => railrun::plan::run(&rest),
        Ok(Command::Doctor(rest)) => railrun::doctor::run(&rest),
        Ok(Command::Help) => {
            print!("{}", cli::HELP);
            0
        }
        Ok(Command::Version) => {
            println!("railrun {}", env!("CARGO_PKG_VERSION"));
            0
        }
        Err(e) => {
            eprintln!("railrun: {e}");
            railrun::job::EXIT_USAGE
        }
    };
    std::process::exit(code);
}

/// `railrun topo ...`.
fn topo(args: &[String]) -> i32 {
    match railrun::topo_cmd::run(args) {
        Ok(code) => code,
        Err(e) if e.starts_with("railrun") => {
            eprintln!("{e}");
            1
        }
        Err(e) => {
            eprintln!("railrun topo: {e}");
            1
        }
    }
}
