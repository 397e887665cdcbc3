module infermux.example/client

go 1.19
