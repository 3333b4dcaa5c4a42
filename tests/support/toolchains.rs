//! The toolchains of other languages, for the tests that need them: the example plugins written
//! in Python and JavaScript (built once by `examples/build.sh` into `target/examples/` and reused
//! while their sources are unchanged) and a Python with the `mcp` client package. When a toolchain
//! cannot be installed (exit status 3 of the script) the caller gets `Err(reason)` and skips with
//! that reason printed; any other failure fails the test.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// What each `examples/build.sh` target gave in this process.
type BuildResults = Mutex<Vec<(&'static str, Result<String, String>)>>;

/// Runs `examples/build.sh TARGET` once per process and returns the last line it printed.
fn build_script(target: &'static str) -> Result<String, String> {
    static RESULTS: OnceLock<BuildResults> = OnceLock::new();
    let results = RESULTS.get_or_init(|| Mutex::new(Vec::new()));
    let mut results = results
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((_, result)) = results.iter().find(|(known, _)| *known == target) {
        return result.clone();
    }
    let script = repo_root().join("examples").join("build.sh");
    let output = Command::new("bash")
        .arg(&script)
        .arg(target)
        .output()
        .unwrap_or_else(|error| panic!("cannot run {}: {error}", script.display()));
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let result = match output.status.code() {
        Some(0) => Ok(String::from_utf8_lossy(&output.stdout)
            .lines()
            .last()
            .unwrap_or_default()
            .to_string()),
        Some(3) => Err(stderr.trim().to_string()),
        _ => panic!(
            "examples/build.sh {target} failed ({}):\n{stderr}",
            output.status
        ),
    };
    results.push((target, result.clone()));
    result
}

/// Runs the setup script `script` with `args` and returns the path it printed last: `Err` with
/// its message when it could not install what it installs (exit status 3), a panic on any other
/// failure.
pub fn setup_script_path(script: &Path, args: &[&str]) -> Result<PathBuf, String> {
    let output = Command::new("bash")
        .arg(script)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|error| panic!("cannot run {}: {error}", script.display()));
    let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
    match output.status.code() {
        Some(0) => String::from_utf8_lossy(&output.stdout)
            .lines()
            .last()
            .map(PathBuf::from)
            .ok_or_else(|| format!("{} printed no path", script.display())),
        Some(3) => Err(stderr),
        _ => panic!("{} failed ({}):\n{stderr}", script.display(), output.status),
    }
}

/// The ACP TypeScript SDK's `node_modules` directory (`examples/build.sh setup-acp`), installed
/// once per process.
pub fn acp_sdk() -> Result<PathBuf, String> {
    build_script("setup-acp").map(PathBuf::from)
}

/// The directory of the example plugin of `language` (`python` or `js`), built if needed.
pub fn example_plugin(language: &'static str) -> Result<PathBuf, String> {
    build_script(language).map(PathBuf::from)
}

/// A WASI preview 2 command program built by componentize-py (`examples/python-command`), built
/// if needed: a component of a toolchain other than this repository's cargo.
pub fn python_command_program() -> Result<PathBuf, String> {
    build_script("python-command").map(PathBuf::from)
}

/// A Python interpreter with the `mcp` client package and pyte (a VT100 emulator) installed.
pub fn python_with_mcp() -> Result<PathBuf, String> {
    build_script("setup-python")?;
    let toolchains = std::env::var_os("CLAWCAGE_TOOLCHAINS")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target").join("toolchains"));
    Ok(toolchains.join("python").join("bin").join("python"))
}

/// The Python whose pyte renders a pseudo-terminal's screen for the terminal tests (installed
/// on first use, as the examples' toolchains are), or `None` after saying why `test` is skipped
/// (a failure under CI).
pub fn screen_python(test: &str) -> Option<PathBuf> {
    match python_with_mcp() {
        Ok(python) => Some(python),
        Err(reason) => {
            skip(test, &reason);
            None
        }
    }
}

/// Prints why a test is skipped, in a form that stands out in the test output. Under CI
/// (`CI=true`) a missing toolchain is a failure, never a skip: `.ci/run` installs every toolchain
/// and a test that does not run proves nothing.
pub fn skip(test: &str, reason: &str) {
    if std::env::var("CI").is_ok_and(|value| value == "true" || value == "1") {
        panic!("{test}: the toolchain is missing under CI ({reason}); .ci/run must install it");
    }
    eprintln!("SKIPPED {test}: the toolchain could not be installed: {reason}");
}
