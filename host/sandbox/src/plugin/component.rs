//! What a plugin's bytes are, read without compiling them: whether they are a WebAssembly
//! component, and the names it imports and exports at the top level (what a published artifact's
//! config lists).

/// Whether `bytes` start as a WebAssembly component (not a core module).
pub fn is_component(bytes: &[u8]) -> bool {
    wasmparser::Parser::is_component(bytes)
}

/// The top-level import and export names of a component; a core module or anything else is
/// refused.
pub fn component_names(bytes: &[u8]) -> Result<(Vec<String>, Vec<String>), String> {
    use wasmparser::{Parser, Payload};
    if !is_component(bytes) {
        return Err(
            "the file is not a WebAssembly component (a plugin is a component; a core module must be made one first, e.g. with `wasm-tools component new`)"
                .to_string(),
        );
    }
    let mut imports = Vec::new();
    let mut exports = Vec::new();
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(bytes) {
        match payload.map_err(|error| format!("the component is malformed: {error}"))? {
            Payload::ModuleSection { .. } | Payload::ComponentSection { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(section) if depth == 0 => {
                for import in section {
                    let import =
                        import.map_err(|error| format!("the component is malformed: {error}"))?;
                    imports.push(import.name.name.to_string());
                }
            }
            Payload::ComponentExportSection(section) if depth == 0 => {
                for export in section {
                    let export =
                        export.map_err(|error| format!("the component is malformed: {error}"))?;
                    exports.push(export.name.name.to_string());
                }
            }
            _ => {}
        }
    }
    Ok((imports, exports))
}
