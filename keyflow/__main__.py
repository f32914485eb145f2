from keyflow.cli.app import main

main()
