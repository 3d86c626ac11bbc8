from sptrace.cli import command

command()
