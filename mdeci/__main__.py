from mdeci.cli import main

raise SystemExit(main())
