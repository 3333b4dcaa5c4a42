//! WASI preview 1 core modules made into preview 2 command components, so an operator program
//! built for `wasm32-wasip1` (or any toolchain that still emits p1) runs through exactly the
//! same linker, shadows and limits as a p2 component: the write budget, the special-file
//! refusal, asked writes, the memory limiter and the epoch deadline all sit at the p2 level.
//! The conversion is wasmtime's own command adapter (the `wasi-preview1-component-adapter-provider`
//! release pinned with wasmtime) applied by wit-component. Before it, the module's
//! `proc_exit` import is pointed at `wasi:cli/exit.exit-with-code`, because the adapter's own
//! `proc_exit` keeps only "zero or not" and a shell needs the exact code; and its `sock_*`
//! imports (p1 can only use sockets it was handed, and exec hands none) at
//! `clawcage:p1/sockets`, whose functions answer "not a socket", because the adapter's own
//! traps and a program that merely links socket code (as wasi-libc builds often do) should run
//! and see an error it can report.

use std::sync::LazyLock;

use wasi_preview1_component_adapter_provider::{
    WASI_SNAPSHOT_PREVIEW1_ADAPTER_NAME, WASI_SNAPSHOT_PREVIEW1_COMMAND_ADAPTER,
};
use wasm_encoder::reencode::{Reencode, RoundtripReencoder};
use wit_component::{ComponentEncoder, StringEncoding};

/// What a program file holds, by its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProgramKind {
    /// A WASI preview 1 core module (run through the command adapter).
    P1Module,
    /// A WASI preview 2 command component.
    P2Component,
    /// A p2 component that answers to many names (argv\[0\]), such as coreutils.
    Multicall,
    /// Not WebAssembly at all.
    NotWasm,
}

impl ProgramKind {
    /// The kind of the program `bytes`: a core module, a component, or neither.
    pub fn of(bytes: &[u8]) -> ProgramKind {
        if wasmparser::Parser::is_core_wasm(bytes) {
            ProgramKind::P1Module
        } else if wasmparser::Parser::is_component(bytes) {
            ProgramKind::P2Component
        } else {
            ProgramKind::NotWasm
        }
    }

    /// How `clawcage programs list` names it.
    pub fn label(self) -> &'static str {
        match self {
            ProgramKind::P1Module => "p1 module",
            ProgramKind::P2Component => "p2 component",
            ProgramKind::Multicall => "multicall",
            ProgramKind::NotWasm => "not wasm",
        }
    }
}

/// What an adapted program's cache key adds to the module's own digest: the adapter's SHA-256
/// and the version of the renaming below, so a new adapter or a changed renaming never loads an
/// artifact made by the old one.
pub(crate) static ADAPTER_DIGEST: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{}+renamed-v1",
        crate::cache::sha256_hex(WASI_SNAPSHOT_PREVIEW1_COMMAND_ADAPTER)
    )
});

/// The world a module whose imports were redirected imports besides the adapter's.
const EXIT_WIT: &str = r#"
package wasi:cli@0.2.12;

interface exit {
  @since(version = 0.2.0)
  exit: func(status: result);
  @since(version = 0.2.12)
  exit-with-code: func(status-code: u8);
}

"#;

/// The p1 socket functions as the host answers them (`programs.rs`), and the world.
const SOCKETS_WIT: &str = r#"
package clawcage:p1@0.1.0;

interface sockets {
  sock-accept: func(fd: u32, in-flags: u32, result-fd: u32) -> u32;
  sock-recv: func(fd: u32, data: u32, data-len: u32, in-flags: u32, size: u32, out-flags: u32) -> u32;
  sock-send: func(fd: u32, data: u32, data-len: u32, in-flags: u32, size: u32) -> u32;
  sock-shutdown: func(fd: u32, how: u32) -> u32;
}

world p1-redirected {
  import wasi:cli/exit@0.2.12;
  import sockets;
}
"#;

/// The interface the host defines the p1 socket functions in.
pub(crate) const SOCKETS_INTERFACE: &str = "clawcage:p1/sockets@0.1.0";

/// The p1 errno every socket function answers: `ENOTSOCK`, since no descriptor is a socket.
pub(crate) const ENOTSOCK: u32 = 57;

/// p1 imports renamed before adapting: (p1 name, interface, function).
const REDIRECTED: [(&str, &str, &str); 5] = [
    ("proc_exit", "wasi:cli/exit@0.2.12", "exit-with-code"),
    ("sock_accept", SOCKETS_INTERFACE, "sock-accept"),
    ("sock_recv", SOCKETS_INTERFACE, "sock-recv"),
    ("sock_send", SOCKETS_INTERFACE, "sock-send"),
    ("sock_shutdown", SOCKETS_INTERFACE, "sock-shutdown"),
];

/// The p1 core module `module` as a p2 command component, or why it cannot be one, in words
/// that name what the module asks for (an import the adapter does not provide, a missing
/// `_start` or `memory` export).
pub(crate) fn adapt(module: &[u8]) -> Result<Vec<u8>, String> {
    let (mut rewritten, redirected) = redirect_proc_exit(module)
        .map_err(|error| format!("it is not a valid WebAssembly module: {error}"))?;
    if redirected {
        let mut resolve = wit_parser::Resolve::default();
        let world = resolve
            .push_str("wasi-cli-exit.wit", EXIT_WIT)
            .and_then(|_| resolve.push_str("clawcage-p1.wit", SOCKETS_WIT))
            .and_then(|package| resolve.select_world(&[package], Some("p1-redirected")))
            .map_err(|error| format!("the exit world cannot be built: {error:#}"))?;
        wit_component::embed_component_metadata(
            &mut rewritten,
            &resolve,
            world,
            StringEncoding::UTF8,
        )
        .map_err(|error| format!("the exit world cannot be embedded: {error:#}"))?;
    }
    ComponentEncoder::default()
        .validate(true)
        .module(&rewritten)
        .and_then(|encoder| {
            encoder.adapter(
                WASI_SNAPSHOT_PREVIEW1_ADAPTER_NAME,
                WASI_SNAPSHOT_PREVIEW1_COMMAND_ADAPTER,
            )
        })
        .and_then(|mut encoder| encoder.encode())
        .map_err(|error| {
            format!(
                "it is a WebAssembly module that cannot run as a WASI preview 1 command: {error:#}"
            )
        })
}

/// `module` with the imports of [`REDIRECTED`] renamed — `proc_exit` to
/// `wasi:cli/exit@0.2.12.exit-with-code` (same core signature: one i32, no result; the code is
/// taken modulo 256 as a POSIX shell sees it), `sock_*` to `clawcage:p1/sockets` (the same
/// i32 parameters and result) —, every other section copied byte for byte; and whether any
/// import was renamed.
fn redirect_proc_exit(module: &[u8]) -> Result<(Vec<u8>, bool), String> {
    let mut output = wasm_encoder::Module::new();
    let mut redirected = false;
    for payload in wasmparser::Parser::new(0).parse_all(module) {
        let payload = payload.map_err(|error| error.to_string())?;
        match payload {
            wasmparser::Payload::ImportSection(reader) => {
                let mut imports = wasm_encoder::ImportSection::new();
                let mut renamer = ProcExitRenamer { redirected: false };
                renamer
                    .parse_import_section(&mut imports, reader)
                    .map_err(|error| format!("{error:?}"))?;
                redirected |= renamer.redirected;
                output.section(&imports);
            }
            other => {
                if let Some((id, range)) = other.as_section() {
                    let data = module
                        .get(range)
                        .ok_or_else(|| "a section runs past the end of the file".to_string())?;
                    output.section(&wasm_encoder::RawSection { id, data });
                }
            }
        }
    }
    Ok((output.finish(), redirected))
}

/// Re-encodes an import section unchanged except for the imports of [`REDIRECTED`].
struct ProcExitRenamer {
    redirected: bool,
}

impl Reencode for ProcExitRenamer {
    type Error = std::convert::Infallible;

    fn parse_imports(
        &mut self,
        section: &mut wasm_encoder::ImportSection,
        imports: wasmparser::Imports<'_>,
    ) -> Result<(), wasm_encoder::reencode::Error<Self::Error>> {
        match imports {
            wasmparser::Imports::Single(_, import)
                if import.module == WASI_SNAPSHOT_PREVIEW1_ADAPTER_NAME
                    && let Some((_, interface, function)) = REDIRECTED
                        .iter()
                        .find(|(p1_name, _, _)| *p1_name == import.name) =>
            {
                self.redirected = true;
                let ty = RoundtripReencoder.entity_type(import.ty)?;
                section.import(interface, function, ty);
                Ok(())
            }
            other => wasm_encoder::reencode::utils::parse_imports(self, section, other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_told_by_the_header() {
        assert_eq!(ProgramKind::of(b"\0asm\x01\0\0\0"), ProgramKind::P1Module);
        assert_eq!(
            ProgramKind::of(b"\0asm\x0d\0\x01\0"),
            ProgramKind::P2Component
        );
        assert_eq!(ProgramKind::of(b"#!/bin/sh\n"), ProgramKind::NotWasm);
        assert_eq!(ProgramKind::of(b""), ProgramKind::NotWasm);
    }

    #[test]
    fn a_p1_module_becomes_a_command_component_with_its_exit_redirected() {
        let module = wat::parse_str(
            r#"(module
                (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
                (memory (export "memory") 1)
                (func (export "_start") (call $exit (i32.const 42))))"#,
        )
        .expect("valid wat");
        let (rewritten, redirected) = redirect_proc_exit(&module).expect("rewritten");
        assert!(redirected);
        assert!(
            wasmparser::Validator::new()
                .validate_all(&rewritten)
                .is_ok()
        );
        let component = adapt(&module).expect("adapted");
        assert_eq!(ProgramKind::of(&component), ProgramKind::P2Component);
    }

    #[test]
    fn a_module_importing_beyond_wasi_is_refused_naming_the_import() {
        let module = wat::parse_str(
            r#"(module
                (import "env" "launch_missiles" (func (param i32)))
                (memory (export "memory") 1)
                (func (export "_start")))"#,
        )
        .expect("valid wat");
        let error = adapt(&module).expect_err("refused");
        assert!(error.contains("env"), "{error}");
    }
}
