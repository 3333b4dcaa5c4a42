//! awk for clawcage's exec: POSIX awk (fields, patterns, -F, -v, arrays, printf). (Being written.)

fn main() {
    clawcage_program_support::enter_working_directory();
    eprintln!("awk: not available yet");
    clawcage_program_support::exit(2);
}
