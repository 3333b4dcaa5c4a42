//! Link settings of the `clawcage` binary. On Linux with the GNU toolchain its relative
//! relocations are packed (`-z pack-relative-relocs`, DT_RELR: glibc 2.36, binutils 2.38 or
//! newer): the dynamic loader applies about a hundred thousand of them at every start, and the
//! packed form is a few kilobytes to read instead of megabytes of `.rela.dyn`.

fn main() {
    let linux_gnu = std::env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "linux")
        && std::env::var("CARGO_CFG_TARGET_ENV").is_ok_and(|env| env == "gnu");
    if linux_gnu {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
