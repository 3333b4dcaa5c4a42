//! diff, cmp and patch for clawcage's exec, one program named by argv[0]. (Being written.)

fn main() {
    clawcage_program_support::enter_working_directory();
    eprintln!("diffutils: not available yet");
    clawcage_program_support::exit(2);
}
