"""CLI commands, one module per part; each defines `register(subparsers)`."""
