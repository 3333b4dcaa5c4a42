//! Host bindings generated from `wit/`, every world in this one file: `basic-tool`, and the
//! `web-tool`, `exec-tool` and `cron-tool` worlds for the host side of their `http`, `process`
//! and `scheduler` imports (`log` and `types` shared with the first). Kept private: the rest of
//! the crate uses the few names re-exported here.

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

/// The `exec-tool` world, for the host side of the `process` import.
pub(crate) mod exec {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "exec-tool",
        imports: { default: async },
        exports: { default: async },
        with: {
            "clawcage:tool/log": crate::bindings::log,
            "clawcage:tool/types": crate::bindings::clawcage::tool::types,
        },
    });
}

/// The `cron-tool` world, for the host side of the `scheduler` import.
pub(crate) mod cron {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "cron-tool",
        imports: { default: async },
        exports: { default: async },
        with: {
            "clawcage:tool/log": crate::bindings::log,
            "clawcage:tool/types": crate::bindings::clawcage::tool::types,
        },
    });
}
