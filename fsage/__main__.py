from fsage.cli import main

main()
