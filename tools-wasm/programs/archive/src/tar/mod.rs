//! `tar`: create (`-c`), extract (`-x`) and list (`-t`) tar archives, gzipped or not, in the
//! spirit of GNU tar. Extraction checks every member itself before writing anything (see
//! `member_paths` and `extract`); a refused member is named on stderr, skipped, and makes the
//! exit status 2, as GNU tar does for members it cannot extract.

mod create;
mod extract;
mod listing;
mod member_paths;
mod options;
mod pattern;

use options::{Operation, Parsed};

/// Runs tar with `args` (without the program name); the exit status.
pub fn run(args: &[String]) -> i32 {
    match options::parse(args) {
        Ok(Parsed::Run(options)) => match options.operation {
            Operation::Create => create::run(&options),
            Operation::Extract | Operation::List => extract::run(&options),
        },
        Ok(Parsed::Help) => {
            println!("{}", options::USAGE);
            0
        }
        Ok(Parsed::Version) => {
            println!("tar (clawcage archive) {}", env!("CARGO_PKG_VERSION"));
            0
        }
        Err(message) => {
            eprintln!("tar: {message}\nTry 'tar --help' for more information.");
            2
        }
    }
}

/// The line GNU tar ends a run with when some members failed.
const FAILED_MEMBERS: &str = "tar: Exiting with failure status due to previous errors";

/// The line GNU tar ends a run with after a fatal error.
const NOT_RECOVERABLE: &str = "tar: Error is not recoverable: exiting now";
