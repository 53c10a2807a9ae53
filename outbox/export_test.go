package outbox

// CancelStatement is Cancel's statement for w, for plan checks.
func CancelStatement(w Writer) string {
	stmt, _, _, err := w.cancel([]string{"0190a5a4-7f3c-7000-8000-000000000001"})
	if err != nil {
		panic(err)
	}
	return stmt
}
