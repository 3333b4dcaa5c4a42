//! Host bindings generated from `wit/` for the `basic-tool` world. Kept private: the rest of the
//! crate uses the few names re-exported here.

wasmtime::component::bindgen!({
    path: "../../wit",
    world: "basic-tool",
    imports: { default: async },
    exports: { default: async },
});

pub use clawcage::tool::log;
pub use exports::clawcage::tool::tool::ToolError as GuestToolError;
