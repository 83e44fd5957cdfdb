module github.com/conveyorq/conveyor

go 1.26
