from evalbot.cli import main

main()
