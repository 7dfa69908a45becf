"""`peerd completion bash|zsh|fish`: the shell's completion script, from click's shell completion.

The script calls `peerd` back with `_PEERD_COMPLETE=<shell>_complete` and the words typed so far;
click answers from the command tree (commands load lazily, so `peerd th<TAB>` imports none).
Install lines are in the user guide ("Shell completion").
"""

from __future__ import annotations

import click

SHELLS = ("bash", "zsh", "fish")
COMPLETE_VAR = "_PEERD_COMPLETE"


@click.command()
@click.argument("shell", type=click.Choice(SHELLS))
@click.pass_context
def completion(ctx: click.Context, shell: str) -> None:
    """Print the completion script for SHELL (bash, zsh or fish); the user guide says where it goes.

    \b
    bash:  eval "$(peerd completion bash)"     in ~/.bashrc
    zsh:   eval "$(peerd completion zsh)"      in ~/.zshrc
    fish:  peerd completion fish > ~/.config/fish/completions/peerd.fish
    """
    from click.shell_completion import get_completion_class  # noqa: PLC0415  # only here

    root = ctx.find_root()
    complete = get_completion_class(shell)
    if complete is None:  # click knows all three; a later click without one says so here
        raise click.UsageError(f"click has no completion for {shell} here.")
    click.echo(complete(root.command, {}, root.info_name or "peerd", COMPLETE_VAR).source())
