//! Host bindings generated from `wit/` for the `basic-tool` and `web-tool` worlds. Kept private:
//! the rest of the crate uses the few names re-exported here.

wasmtime::component::bindgen!({
    path: "../../wit",
    world: "basic-tool",
    imports: { default: async },
    exports: { default: async },
});

pub use clawcage::tool::log;
pub use exports::clawcage::tool::tool::ToolError as GuestToolError;

/// The `web-tool` world, for the host side of the `http` import only; `log` is shared with the
/// bindings above.
mod web {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "web-tool",
        imports: { default: async },
        exports: { default: async },
        with: { "clawcage:tool/log": super::clawcage::tool::log },
    });
}

pub use web::clawcage::tool::http;
