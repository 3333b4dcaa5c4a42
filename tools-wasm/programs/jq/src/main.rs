//! jq for clawcage's exec: JSON filters (jaq). (Being written.)

fn main() {
    clawcage_program_support::enter_working_directory();
    eprintln!("jq: not available yet");
    clawcage_program_support::exit(2);
}
