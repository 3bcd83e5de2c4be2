from moeslots.cli import main

raise SystemExit(main())
