//! uutils coreutils as one WASI command program, the way clawcage's `exec` runs it: the host
//! starts it with `argv[0]` set to the utility's name (`ls`, `wc`, ...), and this `main` enters the
//! shell's working directory (`$PWD`) before handing the arguments to that utility. Started as
//! `coreutils --list` it prints the names it answers to, one a line; the host asks this once when
//! it loads the program.

use std::ffi::OsString;
use std::io::Write as _;

mod cp;
mod mv;
mod operands;
mod resolve;

/// Declares every utility once: the table of names and the dispatch to each crate's `uumain`.
macro_rules! utilities {
    ($($name:literal => $krate:ident),* $(,)?) => {
        /// The names this program answers to.
        const NAMES: &[&str] = &[$($name),*];

        /// Runs utility `name` with `args` (`args[0]` is the name) and returns its exit code, or
        /// `None` when there is no such utility.
        fn dispatch(name: &str, args: Vec<OsString>) -> Option<i32> {
            match name {
                $($name => Some($krate::uumain(args.into_iter())),)*
                _ => None,
            }
        }
    };
}

utilities! {
    "arch" => uu_arch,
    "b2sum" => uu_b2sum,
    "base32" => uu_base32,
    "base64" => uu_base64,
    "basename" => uu_basename,
    "basenc" => uu_basenc,
    "cat" => uu_cat,
    "cksum" => uu_cksum,
    "comm" => uu_comm,
    "cp" => uu_cp,
    "csplit" => uu_csplit,
    "cut" => uu_cut,
    "date" => uu_date,
    "dd" => uu_dd,
    "dir" => uu_dir,
    "dircolors" => uu_dircolors,
    "dirname" => uu_dirname,
    "echo" => uu_echo,
    "expand" => uu_expand,
    "expr" => uu_expr,
    "factor" => uu_factor,
    "false" => uu_false,
    "fmt" => uu_fmt,
    "fold" => uu_fold,
    "head" => uu_head,
    "hostid" => uu_hostid,
    "join" => uu_join,
    "link" => uu_link,
    "ln" => uu_ln,
    "ls" => uu_ls,
    "md5sum" => uu_md5sum,
    "mkdir" => uu_mkdir,
    "mktemp" => uu_mktemp,
    "mv" => uu_mv,
    "nice" => uu_nice,
    "nl" => uu_nl,
    "nproc" => uu_nproc,
    "numfmt" => uu_numfmt,
    "od" => uu_od,
    "paste" => uu_paste,
    "pathchk" => uu_pathchk,
    "pr" => uu_pr,
    "printenv" => uu_printenv,
    "printf" => uu_printf,
    "ptx" => uu_ptx,
    "pwd" => uu_pwd,
    "readlink" => uu_readlink,
    "realpath" => uu_realpath,
    "rm" => uu_rm,
    "rmdir" => uu_rmdir,
    "seq" => uu_seq,
    "sha1sum" => uu_sha1sum,
    "sha224sum" => uu_sha224sum,
    "sha256sum" => uu_sha256sum,
    "sha384sum" => uu_sha384sum,
    "sha512sum" => uu_sha512sum,
    "shred" => uu_shred,
    "shuf" => uu_shuf,
    "sleep" => uu_sleep,
    "sort" => uu_sort,
    "split" => uu_split,
    "sum" => uu_sum,
    "tail" => uu_tail,
    "tee" => uu_tee,
    "[" => uu_test,
    "test" => uu_test,
    "touch" => uu_touch,
    "tr" => uu_tr,
    "true" => uu_true,
    "truncate" => uu_truncate,
    "tsort" => uu_tsort,
    "tty" => uu_tty,
    "uname" => uu_uname,
    "unexpand" => uu_unexpand,
    "uniq" => uu_uniq,
    "unlink" => uu_unlink,
    "vdir" => uu_vdir,
    "wc" => uu_wc,
    "yes" => uu_yes,
}

fn main() {
    clawcage_program_support::enter_working_directory();
    let mut args: Vec<OsString> = std::env::args_os().collect();
    let invoked = args
        .first()
        .map(|arg0| utility_name(&arg0.to_string_lossy()))
        .unwrap_or_default();
    if invoked == "coreutils" {
        // `coreutils NAME ARGS...` runs NAME; `coreutils --list` prints the names.
        match args.get(1).map(|arg| arg.to_string_lossy().into_owned()) {
            Some(flag) if flag == "--list" => list(),
            Some(_) => {
                args.remove(0);
            }
            None => usage_and_exit(),
        }
    }
    let name = args
        .first()
        .map(|arg0| utility_name(&arg0.to_string_lossy()))
        .unwrap_or_default();
    // Messages are English, built in; a failure here means a broken build, not bad input.
    if let Err(error) = uucore::locale::setup_localization(canonical(&name)) {
        eprintln!("{name}: cannot set up its messages: {error}");
        clawcage_program_support::exit(1);
    }
    // `mv` in its common forms does not go through uutils, whose check of the paths reaches
    // above the workspace (see mv.rs).
    if name == "mv"
        && let Some(code) = mv::run(&args)
    {
        clawcage_program_support::exit(code);
    }
    // So does `cp -r` (see cp.rs).
    if name == "cp"
        && let Some(code) = cp::run(&args)
    {
        clawcage_program_support::exit(code);
    }
    // And `realpath` and `readlink -f` (see resolve.rs).
    if (name == "realpath" || name == "readlink")
        && let Some(code) = resolve::run(name == "readlink", &args)
    {
        clawcage_program_support::exit(code);
    }
    match dispatch(&name, args) {
        Some(code) => clawcage_program_support::exit(code),
        None => {
            eprintln!("coreutils: no utility named '{name}'; `coreutils --list` prints the names");
            clawcage_program_support::exit(1);
        }
    }
}

/// The file name part of `arg0` (the host passes a bare name; a path also works).
fn utility_name(arg0: &str) -> String {
    arg0.rsplit('/').next().unwrap_or(arg0).to_string()
}

/// The utility whose messages `name` uses (`[` is `test`, `dir` and `vdir` are `ls`).
fn canonical(name: &str) -> &str {
    match name {
        "[" => "test",
        "dir" | "vdir" => "ls",
        other => other,
    }
}

fn list() -> ! {
    let mut out = std::io::stdout().lock();
    for name in NAMES {
        if writeln!(out, "{name}").is_err() {
            clawcage_program_support::exit(1);
        }
    }
    clawcage_program_support::exit(0);
}

fn usage_and_exit() -> ! {
    eprintln!("usage: coreutils NAME [ARGS...]  or  coreutils --list");
    clawcage_program_support::exit(1);
}
