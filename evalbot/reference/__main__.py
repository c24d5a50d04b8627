from evalbot.reference.cli import main

raise SystemExit(main())
