//! The MCP face of snakebox.
