//! tar, gzip, gunzip and zcat for clawcage's exec, one program named by argv[0]. (Being written.)

fn main() {
    clawcage_program_support::enter_working_directory();
    eprintln!("archive: not available yet");
    clawcage_program_support::exit(2);
}
