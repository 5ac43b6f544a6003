from tests.foundation.toycap import main

main()
