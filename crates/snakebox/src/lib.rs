//! The snakebox binary's library: CLI definitions, settings resolution, commands.
