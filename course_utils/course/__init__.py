"""What makes the code a course: quizzes, exercise graders, figures, widgets, badges and
the book."""
