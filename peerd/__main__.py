from peerd.cli.main import main

main()
