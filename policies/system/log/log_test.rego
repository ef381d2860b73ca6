package system.log_test

import data.system.log

test_arguments_are_masked if {
	"/input/arguments" in log.mask
}

test_approval_token_is_masked if {
	"/input/approval/token" in log.mask
}
