from proxy.cli import main

if __name__ == "__main__":  # not when a spawned child (the access-log writer) imports it as __mp_main__
    main()
