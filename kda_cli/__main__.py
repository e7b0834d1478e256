from kda_cli.app import main

main()
