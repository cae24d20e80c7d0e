"""One module per ``mdeci`` subcommand family; see :data:`mdeci.cli.COMMANDS`."""
