//! `tar`, `gzip`, `gunzip` and `zcat` for clawcage's exec tool, as one WASI command program:
//! the tool is chosen by the file name in argv[0], or by the first argument when the program
//! is run as `archive` (`archive tar -tf a.tar`). tar creates, lists and extracts archives
//! (gzipped or not) and refuses, by name, any member that would land outside the extraction
//! directory; gzip and its two aliases compress and decompress files or standard input.

mod errors;
mod gzip;
mod tar;

fn main() {
    clawcage_program_support::enter_working_directory();
    let args: Vec<String> = std::env::args().collect();
    let invoked_as = args
        .first()
        .map(|arg0| program_name(arg0))
        .unwrap_or("archive");
    let (name, rest) = if invoked_as == "archive" {
        match args.get(1) {
            Some(name) => (program_name(name), &args[2..]),
            None => {
                eprintln!("archive: name a program: archive tar|gzip|gunzip|zcat ARGS...");
                clawcage_program_support::exit(2);
            }
        }
    } else {
        (invoked_as, args.get(1..).unwrap_or_default())
    };
    let code = match name {
        "tar" => tar::run(rest),
        "gzip" => gzip::run(gzip::Invocation::Gzip, rest),
        "gunzip" => gzip::run(gzip::Invocation::Gunzip, rest),
        "zcat" => gzip::run(gzip::Invocation::Zcat, rest),
        other => {
            eprintln!(
                "archive: unknown program '{other}'; this program runs as tar, gzip, gunzip or zcat"
            );
            2
        }
    };
    clawcage_program_support::exit(code);
}

/// The program a path names: its file name, without a `.wasm` ending.
fn program_name(path: &str) -> &str {
    let file = path.rsplit('/').next().unwrap_or(path);
    file.strip_suffix(".wasm").unwrap_or(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_program_is_the_file_name() {
        assert_eq!(program_name("tar"), "tar");
        assert_eq!(program_name("/bin/zcat"), "zcat");
        assert_eq!(program_name("archive.wasm"), "archive");
    }
}
