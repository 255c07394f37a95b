"""`eventosctl completion bash|zsh`: completion scripts generated from the parser itself, so
they know every command, option and choice the installed `eventosctl` has.

    source <(eventosctl completion bash)      # bash, e.g. in ~/.bashrc
    source <(eventosctl completion zsh)       # zsh, after compinit

They complete command names, a command's fixed words (`attention ack`, `users add`), its
options (after a `-`), an option's choices (`-o json|yaml|wide`, `--state pending|…`) and file
names after `-f` and `--stack`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

SHELLS = ("bash", "zsh")
FILE_OPTIONS = ("-f", "--filename", "--stack")


@dataclass
class Command:
    """What completes after one command: its options, its words, each option's choices."""

    name: str
    help: str
    options: list[str] = field(default_factory=list)
    words: list[str] = field(default_factory=list)
    choices: dict[str, list[str]] = field(default_factory=dict)
    takes_value: list[str] = field(default_factory=list)

    @property
    def files(self) -> list[str]:
        """Its options that take a file name."""
        return [o for o in self.takes_value if o in FILE_OPTIONS]


def _describe(name: str, parser: argparse.ArgumentParser, help_text: str) -> Command:
    found = Command(name, help_text)
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
            continue
        if action.option_strings:
            found.options += action.option_strings
            if action.nargs != 0:
                found.takes_value += action.option_strings
            if action.choices:
                for flag in action.option_strings:
                    found.choices[flag] = [str(c) for c in action.choices]
        elif action.choices:
            found.words += [str(c) for c in action.choices]
    return found


def commands(parser: argparse.ArgumentParser) -> tuple[Command, list[Command]]:
    """The top level (its options) and every command, in the parser's order."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help or "" for a in sub._choices_actions}
    top = _describe("", parser, "")
    return top, [_describe(n, p, helps.get(n, "")) for n, p in sub.choices.items()]


def _bash_cases(cases: dict[str, list[str]], indent: str) -> str:
    lines = [f'{indent}{"|".join(flags)}) COMPREPLY=($(compgen -W "{words}" -- "$cur")); return ;;'
             for words, flags in _by_words(cases).items()]  # fmt: skip
    return "\n".join(lines)


def _by_words(choices: dict[str, list[str]]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for flag, words in choices.items():
        grouped.setdefault(" ".join(words), []).append(flag)
    return grouped


def bash(parser: argparse.ArgumentParser) -> str:
    """The bash completion script."""
    top, cmds = commands(parser)
    skip = "|".join(top.takes_value)
    per_command = []
    for c in cmds:
        cases = _bash_cases(c.choices, "                ")
        if c.files:
            cases += (f'\n                {"|".join(c.files)}) '
                      'COMPREPLY=($(compgen -f -- "$cur")); return ;;')  # fmt: skip
        per_command.append(f"""        {c.name})
            case "$prev" in
{cases}
            esac
            words="{" ".join(c.words)}" opts="{" ".join(c.options)}" ;;""")
    body = "\n".join(per_command)
    return f"""# eventosctl completion for bash: source <(eventosctl completion bash)
_eventosctl() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    local cmd="" skip=0 i words opts
    for ((i = 1; i < COMP_CWORD; i++)); do
        if ((skip)); then skip=0; continue; fi
        case "${{COMP_WORDS[i]}}" in
            {skip}) skip=1 ;;
            -*) ;;
            *) cmd="${{COMP_WORDS[i]}}"; break ;;
        esac
    done
    case "$prev" in
        {"|".join(top.files)}) COMPREPLY=($(compgen -f -- "$cur")); return ;;
{_bash_cases(top.choices, "        ")}
    esac
    if [[ -z "$cmd" ]]; then
        if [[ "$cur" == -* ]]; then words="{" ".join(top.options)}"
        else words="{" ".join(c.name for c in cmds)}"; fi
        COMPREPLY=($(compgen -W "$words" -- "$cur"))
        return
    fi
    case "$cmd" in
{body}
        *) words="" opts="" ;;
    esac
    [[ "$cur" == -* ]] && words="$opts"
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
}}
complete -F _eventosctl eventosctl
"""


def _zsh_quote(text: str) -> str:
    return text.replace("'", "'\\''").replace(":", "\\:")


def zsh(parser: argparse.ArgumentParser) -> str:
    """The zsh completion script (sourced, or as `_eventosctl` on $fpath)."""
    top, cmds = commands(parser)
    described = "\n".join(f"    '{c.name}:{_zsh_quote(c.help)}'" for c in cmds)
    choices = {**top.choices}
    per_command = []
    for c in cmds:
        cases = "\n".join(f"                {'|'.join(flags)}) compadd -- {words}; return ;;"
                          for words, flags in _by_words(c.choices).items())  # fmt: skip
        if c.files:
            cases += f"\n                {'|'.join(c.files)}) _files; return ;;"
        per_command.append(f"""        {c.name})
            case $prev in
{cases}
            esac
            if [[ $PREFIX == -* ]]; then compadd -- {" ".join(c.options)}
            else compadd -- {" ".join(c.words)}; fi ;;""")
    top_cases = "\n".join(f"        {'|'.join(flags)}) compadd -- {words}; return ;;"
                          for words, flags in _by_words(choices).items())  # fmt: skip
    return f"""#compdef eventosctl
# eventosctl completion for zsh: source <(eventosctl completion zsh), after compinit
_eventosctl() {{
    local -a commands
    commands=(
{described}
    )
    local cmd="" prev="${{words[CURRENT-1]}}" i skip=0
    for ((i = 2; i < CURRENT; i++)); do
        if ((skip)); then skip=0; continue; fi
        case "${{words[i]}}" in
            {"|".join(top.takes_value)}) skip=1 ;;
            -*) ;;
            *) cmd="${{words[i]}}"; break ;;
        esac
    done
    case $prev in
        {"|".join(top.files)}) _files; return ;;
{top_cases}
    esac
    if [[ -z $cmd ]]; then
        if [[ $PREFIX == -* ]]; then compadd -- {" ".join(top.options)}
        else _describe 'command' commands; fi
        return
    fi
    case $cmd in
{chr(10).join(per_command)}
    esac
}}
if [[ $zsh_eval_context[-1] == loadautofunc ]]; then
    _eventosctl "$@"
else
    compdef _eventosctl eventosctl
fi
"""


def cmd_completion(args: argparse.Namespace) -> int:
    """Print the script that completes `args.parser` (the whole `eventosctl` parser)."""
    script = bash if args.shell == "bash" else zsh
    print(script(args.parser), end="")
    return 0
