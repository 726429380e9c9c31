"""The commands: one module per `levels` command, each composing the harness core below it.

    check  compare  profile  select  agree  explain  bench  doctor  train  assignment  grade

Each module has `add_parser(subparsers)` (its part of the command line) and
`run(args, console) -> exit code`; `equivalence.cli` only wires them together. What two
commands share lives below both: the harness core (`equivalence/`), or, for the terminal
(exit codes, device parsing, progress bars, where libraries' output goes), `console.py`.
Nothing here imports the CLI, and nothing in the core imports a command.
"""
