"""The `nereus` command: one module per group of subcommands, `main` puts them together."""
