//! `diff`, `cmp` and `patch` for clawcage's exec tool: one WASI command program that does the job
//! its name asks for. The exec shell starts it with argv[0] set to `diff`, `cmp` or `patch`;
//! started as `diffutils`, its first argument names the tool (`diffutils diff a b`). Each tool
//! ends with the exit status GNU diffutils uses: 0 same (or applied), 1 different (or a hunk
//! failed), 2 trouble.

mod apply;
mod cmp;
mod diff;
mod lines;
mod patch;

use clawcage_program_support::{enter_working_directory, exit};

const USAGE: &str = "usage: diffutils diff|cmp|patch [ARGUMENTS...]";

fn main() {
    enter_working_directory();
    let args: Vec<String> = std::env::args().collect();
    exit(run(&args));
}

/// Run the tool named by the file name part of `args[0]` (or by `args[1]` when that name is
/// `diffutils`) with the arguments after it, and return its exit status.
fn run(args: &[String]) -> i32 {
    let name = args
        .first()
        .map(|arg| tool_name(arg))
        .unwrap_or("diffutils");
    let (name, rest) = if name == "diffutils" {
        match args.get(1) {
            Some(tool) => (tool_name(tool), args.get(2..).unwrap_or_default()),
            None => {
                eprintln!("diffutils: name the tool to run\n{USAGE}");
                return 2;
            }
        }
    } else {
        (name, args.get(1..).unwrap_or_default())
    };
    match name {
        "diff" => diff::main(rest),
        "cmp" => cmp::main(rest),
        "patch" => patch::main(rest),
        "--help" | "-h" => {
            println!("{USAGE}");
            0
        }
        other => {
            eprintln!("diffutils: '{other}' is not one of diff, cmp, patch\n{USAGE}");
            2
        }
    }
}

/// The file name part of a program path: `/bin/diff` → `diff`.
fn tool_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_names_are_file_name_parts() {
        assert_eq!(tool_name("/usr/bin/diff"), "diff");
        assert_eq!(tool_name("patch"), "patch");
    }

    #[test]
    fn unknown_tools_are_trouble() {
        assert_eq!(run(&["diffutils".into(), "sdiff".into()]), 2);
        assert_eq!(run(&["diffutils".into()]), 2);
        assert_eq!(run(&["ed".into()]), 2);
    }
}
