from dspark.cli import main

main()
